"""The ephemeral-storage capacity a node's kubelet reports: the filesystem on its volume, not the volume.

The kubelet takes its ephemeral-storage capacity from the filesystem holding its root directory: cAdvisor's
`RootFsInfo().Capacity` (kubernetes `pkg/kubelet/cadvisor/util.go`, `EphemeralStorageCapacityFromFsInfo`), statfs's
`f_blocks × f_frsize` (google/cadvisor `fs/fs.go`, `getVfsStats`). That is smaller than the EBS volume: the
partition table and boot partitions, then what the filesystem keeps out of `f_blocks` — XFS its internal log
(linux `fs/xfs/xfs_super.c`), ext4 its overhead: inode tables, bitmaps, superblock and descriptor copies, the
journal (`fs/ext4/super.c`, `ext4_statfs`). Planning on the volume's size bought nodes a pod sized into the gap
never fits on, and the pod was planned again after the scheduling grace, a node each time (Karpenter has the same
model and the same open bug: kubernetes-sigs/karpenter #3253; aws/karpenter-provider-aws #4017).

The planned filesystem is the volume less 2 % and 1 GiB, a bound on both filesystems the supported images put on
the kubelet's volume:

- XFS (AL2023's root; Bottlerocket's data partition from the `aws-k8s-1.28` variants): a log of max(64 MiB,
  1/2048 of the filesystem) up to 2 GiB (xfsprogs `mkfs/xfs_mkfs.c`, `calculate_log_size`), a last allocation group
  under 16 MiB dropped, AL2023's 12 MiB of GPT and boot partitions;
- ext4 (Bottlerocket's data partition on older variants, `mke2fs.conf`: a 256-byte inode per 16 KiB): inode tables
  1/64 of the volume, bitmaps 1/16384, superblock and group-descriptor copies with their reserved growth blocks
  (sparse_super, resize_inode: under 70 MiB below 128 GiB, ~200 MiB at 16 TiB), and the default journal, at most
  512 MiB below 128 GiB and 1 GiB from there (e2fsprogs `ext2fs_default_journal_size`); from 128 GiB the 2 %
  leaves over 550 MiB past the 1/64 for the copies.

Measured against it: an EKS AMI's 20 GiB XFS root is a 20,959,212 KiB filesystem (awslabs/amazon-eks-ami PR #1126,
planned 18.6 GiB), a Bottlerocket 20 GiB ext4 data volume 20,624,592 KiB (eksctl-io/eksctl #4434).
"""

from __future__ import annotations

__all__ = ["filesystem_bytes"]

_SHARE_PERCENT = 2
"""The share of the volume the filesystem may keep for itself (see the module)."""
_FIXED = 2**30
"""What it may keep besides: 1 GiB (see the module)."""


def filesystem_bytes(volume_bytes: int) -> int:
    """The ephemeral-storage capacity planned for a node whose kubelet volume is this large: the volume less 2 % and
    1 GiB, never above the filesystem a supported image makes on it (see the module); never below zero."""
    share = -(-volume_bytes * _SHARE_PERCENT // 100)
    return max(0, volume_bytes - share - _FIXED)
