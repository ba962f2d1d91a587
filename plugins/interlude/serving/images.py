"""Container image references: parsed, normalised, and refused when they are not pinned.

Why: an image param reaches the cluster verbatim, so it must have the shape a registry accepts (no
whitespace, no control characters, lowercase repository path) and must be pinned - by a tag the runtime
table knows or by a sha256 digest - so "deploy" twice runs the same bits. Grammar: the distribution
reference format (https://github.com/distribution/reference/blob/main/reference.go) used by Docker and
Artifact Registry (https://cloud.google.com/artifact-registry/docs/docker/names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from interlude.params import shown

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
DEFAULT_REGISTRY = "docker.io"
MAX_NAME = 255


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str  # path inside the registry, e.g. vllm/vllm-tpu
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """registry/repository, the key the runtime table uses (docker.io/vllm/vllm-tpu)."""
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")


def parse_image(param: str, ref: str) -> ImageRef:
    """The reference, or ValueError naming `param` (shape, not pinned, too long)."""
    if not isinstance(ref, str) or not ref or ref != ref.strip() or any(c.isspace() for c in ref):
        raise ValueError(f"{param}: {shown(ref)} is not an image reference (no whitespace allowed)")
    match = _REFERENCE.match(ref)
    if match is None:
        raise ValueError(f"{param}: {shown(ref)} is not an image reference (registry/name:tag or name@sha256:<64 hex>)")
    domain, path = match.group("domain"), match.group("path")
    # Docker's rule: the first component is a registry only if it has a dot, a port, or is localhost.
    if domain is not None and not ("." in domain or ":" in domain or domain == "localhost"):
        path, domain = f"{domain}/{path}", None
    name = f"{domain or DEFAULT_REGISTRY}/{path}"
    if len(name) > MAX_NAME:
        raise ValueError(f"{param}: the image name is longer than {MAX_NAME} characters")
    tag, digest = match.group("tag"), match.group("digest")
    if tag is None and digest is None:
        raise ValueError(f"{param}: {shown(ref)} is not pinned: give a tag (name:tag) or a digest (name@sha256:...)")
    if tag == "latest" and digest is None:
        raise ValueError(f"{param}: {shown(ref)}: 'latest' moves; pin a release tag or a digest")
    return ImageRef(domain or DEFAULT_REGISTRY, path, tag, digest)
