"""Container image references, as containerd and the kubelet read them (`[registry/]repository[:tag][@digest]`).

The grammar is the OCI distribution reference's (github.com/distribution/reference, `reference.go`): a
registry is a host name with an optional port, recognised by a dot, a colon or `localhost` in the first
path element; repository components are lowercase alphanumerics joined by `.`, `_`, `__` or dashes.
Pools pre-pull images by reference and the snapshot helper seeds volumes from them, so each reference is
checked once, in the configuration, rather than failing on a node at boot.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ImageReference", "ecr_region", "parse_image_reference"]

_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(
    rf"^(?P<name>(?:(?P<domain>{_DOMAIN})/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?$"
)
_ECR = re.compile(r"^\d{12}\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")
_NAME_MAX = 255


@dataclass(frozen=True)
class ImageReference:
    registry: str
    """`docker.io` when the reference names none."""
    repository: str
    tag: str | None
    digest: str | None

    @property
    def pinned(self) -> bool:
        """Names a tag or a digest: an untagged reference means `latest`, whatever is newest at boot."""
        return self.tag is not None or self.digest is not None


def parse_image_reference(text: str) -> ImageReference:
    """Raises `ValueError` naming the reference when it is not one containerd can pull."""
    match = _REFERENCE.match(text)
    if match is None or len(match["name"]) > _NAME_MAX:
        raise ValueError(f"'{text}' is not an image reference such as 'public.ecr.aws/org/image:1.2'")
    domain = match["domain"]
    # A first element without '.', ':' or 'localhost' is a repository component (`library/ubuntu`), not a host.
    if domain is not None and not ("." in domain or ":" in domain or domain == "localhost"):
        domain = None
    name = match["name"]
    repository = name[len(domain) + 1:] if domain else name
    if domain is None and "/" not in repository:
        repository = f"library/{repository}"
    return ImageReference(registry=domain or "docker.io", repository=repository, tag=match["tag"],
                          digest=match["digest"])


def ecr_region(reference: ImageReference) -> str | None:
    """The region of a private ECR registry (`<account>.dkr.ecr.<region>.amazonaws.com`), which needs a
    token to pull from; None for any other registry."""
    match = _ECR.match(reference.registry)
    return match["region"] if match else None
