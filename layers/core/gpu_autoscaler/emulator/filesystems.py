"""The filesystem an EKS node's OS makes on the kubelet's volume, and the size a kubelet reports for it.

The kubelet's ephemeral-storage capacity is the size of the filesystem holding its root directory: cAdvisor's
`RootFsInfo().Capacity` (kubernetes `pkg/kubelet/cadvisor/util.go`, `EphemeralStorageCapacityFromFsInfo`), which is
statfs's `f_blocks × f_frsize` (google/cadvisor `fs/fs.go`, `getVfsStats`). That is less than the volume: partition
table and boot partitions, then what the filesystem keeps for itself and leaves out of `f_blocks`:

- XFS leaves out its internal log: `f_blocks = sb_dblocks − sb_logblocks` (linux `fs/xfs/xfs_super.c`, the statfs
  of the data device);
- ext4 leaves out its overhead — superblock and group descriptor copies, their reserved growth blocks, bitmaps,
  inode tables and the journal (linux `fs/ext4/super.c`, `ext4_statfs` subtracts `s_overhead` under the default
  `bsddf`; `ext4_calculate_overhead`).

Written from those filesystems' mkfs defaults, never from the planner's estimate. Where the node could have either
of two sizes, the smaller is reported, so a plan too optimistic for some real node fails here:

- AL2023: the root partition, XFS, beside a 1 MiB BIOS boot and a 10 MiB EFI partition (`lsblk` on an EKS AL2023
  node: `nvme0n1p1` on `/`, `nvme0n1p127` 1M, `nvme0n1p128` 10M on `/boot/efi`; aws-samples/karpenter-blueprints
  PR #34). Its filesystem is made at image build and grown at boot (the log keeps its size); the model takes the
  log mkfs.xfs would make at the grown size, the larger.
- Bottlerocket: the data partition `BOTTLEROCKET-DATA` on `/dev/xvdb`, resized to the volume less 1 MiB at the end
  (`release-repart-local.conf`) and formatted on first boot by `prepare-local-fs.service` (`systemd-makefs`) with the
  variant's `DATA_PARTITION_FILESYSTEM`: XFS on the `aws-k8s-1.28` variants and later (`xfs-data-partition`),
  ext4 before. The instance does not say which variant it runs, so the model takes ext4: the smaller filesystem.
"""

from __future__ import annotations

import math

__all__ = ["ext4_bytes", "kubelet_filesystem_bytes", "xfs_bytes"]

MIB = 2**20
GIB = 2**30
TIB = 2**40
BLOCK = 4096
"""Both filesystems' block size here (mkfs.xfs's default; Bottlerocket's `mke2fs.conf` `blocksize = 4096`)."""
GPT_START = MIB
"""The first partition starts at 1 MiB (the protective MBR and the primary GPT before it, aligned)."""
GPT_END = MIB
"""The backup GPT at the end (33 sectors), with the partition ended on a 1 MiB boundary before it."""
AL2023_BOOT_PARTITIONS = 11 * MIB
"""AL2023's BIOS boot (1 MiB) and EFI (10 MiB) partitions, before the root partition."""

XFS_MIN_REALISTIC_LOG = 64 * MIB
"""mkfs.xfs's smallest default internal log (xfsprogs `mkfs/xfs_mkfs.c`, `XFS_MIN_REALISTIC_LOG_BLOCKS`)."""
XFS_LOG_RATIO = 2048
"""mkfs.xfs sizes the default log at 1/2048 of the filesystem (`calculate_log_size`)."""
XFS_MAX_LOG = 2 * GIB
"""The largest log (`XFS_MAX_LOG_BYTES`, 2 GiB less a little: the model takes 2 GiB)."""
XFS_AG_MIN = 16 * MIB
"""mkfs.xfs drops a last allocation group smaller than this (`XFS_AG_MIN_BYTES`): the model counts it dropped."""

EXT4_BLOCKS_PER_GROUP = 8 * BLOCK
"""One block bitmap's worth of blocks per group (32,768: 128 MiB)."""
EXT4_INODE_SIZE = 256
EXT4_DESCRIPTOR_SIZE = 64
"""Group descriptors of a `64bit` filesystem (Bottlerocket's `mke2fs.conf` ext4 features)."""


def kubelet_filesystem_bytes(os_family: str, volume_bytes: int) -> int:
    """The ephemeral-storage capacity a kubelet reports when its volume (AL2023's root, Bottlerocket's data
    volume) is this large (see the module)."""
    if os_family == "Bottlerocket":
        return ext4_bytes(volume_bytes - GPT_START - GPT_END)
    return xfs_bytes(volume_bytes - GPT_START - AL2023_BOOT_PARTITIONS - GPT_END)


def xfs_bytes(partition_bytes: int) -> int:
    """statfs's size of an XFS filesystem mkfs.xfs makes with its defaults on a partition this large: the data
    blocks less the internal log."""
    blocks = (partition_bytes - XFS_AG_MIN) // BLOCK
    log = min(max(XFS_MIN_REALISTIC_LOG, blocks * BLOCK // XFS_LOG_RATIO), XFS_MAX_LOG)
    return (blocks - log // BLOCK) * BLOCK


def ext4_bytes(partition_bytes: int) -> int:
    """statfs's size of an ext4 filesystem mke2fs makes with Bottlerocket's `mke2fs.conf` on a partition this large:
    the blocks less its overhead (see the module)."""
    blocks = partition_bytes // BLOCK
    groups = math.ceil(blocks / EXT4_BLOCKS_PER_GROUP)
    inode_table_blocks = EXT4_BLOCKS_PER_GROUP * BLOCK // _inode_ratio(partition_bytes) * EXT4_INODE_SIZE // BLOCK
    per_group = 2 + inode_table_blocks  # block and inode bitmaps, the inode table
    descriptors_per_block = BLOCK // EXT4_DESCRIPTOR_SIZE
    descriptor_blocks = math.ceil(groups / descriptors_per_block)
    copies = _superblock_copies(groups)
    overhead = (groups * per_group + copies * (1 + descriptor_blocks + _reserved_gdt_blocks(blocks, descriptor_blocks))
                + _journal_blocks(blocks))
    return (blocks - overhead) * BLOCK


def _inode_ratio(size_bytes: int) -> int:
    """Bytes per inode by mke2fs's size class (`mke2fs.conf`): `big` from 4 TiB, `huge` from 16 TiB, else 16 KiB."""
    return 65536 if size_bytes >= 16 * TIB else 32768 if size_bytes >= 4 * TIB else 16384


def _superblock_copies(groups: int) -> int:
    """`sparse_super`: groups 0 and 1 and the powers of 3, 5 and 7 hold a superblock and descriptor copy."""
    holders = {group for group in (0, 1) if group < groups}
    for base in (3, 5, 7):
        power = base
        while power < groups:
            holders.add(power)
            power *= base
    return len(holders)


def _reserved_gdt_blocks(blocks: int, descriptor_blocks: int) -> int:
    """`resize_inode`: descriptor blocks reserved for growing to 1024 × the size or 2^32 blocks, whichever is
    smaller, at most one block of addresses (e2fsprogs `misc/mke2fs.c`, `calc_reserved_gdt_blocks`)."""
    max_blocks = min(blocks * 1024, 2**32 - 1)
    groups = math.ceil(max_blocks / EXT4_BLOCKS_PER_GROUP)
    reserved = math.ceil(groups / (BLOCK // EXT4_DESCRIPTOR_SIZE)) - descriptor_blocks
    return max(0, min(reserved, BLOCK // 4))


def _journal_blocks(blocks: int) -> int:
    """mke2fs's default journal for a filesystem this large (e2fsprogs `lib/ext2fs/mkjournal.c`,
    `ext2fs_default_journal_size`): 4 MiB from 8 MiB up to 1 GiB from 128 GiB."""
    for below, journal in ((32768, 1024), (256 * 1024, 4096), (512 * 1024, 8192), (4096 * 1024, 16384),
                           (8192 * 1024, 32768), (16384 * 1024, 65536), (32768 * 1024, 131072)):
        if blocks < below:
            return journal
    return 262144
