"""The one file-access policy: every file the appliance opens for a config, a workflow or a
request (workflows, models, labels files, videos) is checked here first.

Two policies exist per runtime (docs/security.md):
- the owner's (`FilePolicy.owner`): the config file and the CLI are run by whoever owns the
  machine, so any path they name may be read; the regular-file rule and size caps still
  hold, so a config that names `/dev/zero` as a workflow fails instead of eating memory;
- the requests' (appliance/policy/request_files.py builds it): paths that arrive over the API,
  and everything those files name in turn, resolve (symlinks followed) only under its
  roots, and the loaded config file (it holds the API token) and every secret file the
  config names (passwords, TLS keys) are never among them.

The rules, in the order they are checked, so that a refused path reveals nothing about
what lies outside the roots: under a root → not hidden nor named like a secret (requests
only: where the file really lies, below its root) → exists → not a denied file (the
config, a secret: matched by device and inode, so another link to one is refused too) →
a regular file (no devices, FIFOs, sockets, directories) → at most the kind's size cap.
Reads are bounded by the cap as well (a file may grow between the check and the read),
the open never blocks (O_NONBLOCK: a FIFO swapped in after the check cannot hang a
request), and the opened file is checked again (a denied file swapped in after the check
is refused). A labels file must read as one: capped in lines and their length, and no
line that is a setting or a key (`read_labels`). Messages name the rule and the path as
it was given, never the file's content.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from appliance.config import AppConfig, ConfigError
from appliance.errors import FileAccessError, LimitError
from appliance.policy.limits import LimitsConfig
from appliance.sources.base import source_kind
from appliance.sources.config import SourceConfig

# FFmpeg options that let a demuxer open more than the URL it was given (libavformat's
# protocol lists, the concat demuxer's `safe`, HLS's extension checks, the HTTP proxy),
# or read a file the request policy never checked (its TLS layer's CA, certificate and
# key files: `source.tls.ca_file` is the checked way).
UNSAFE_FFMPEG_OPTIONS = frozenset(
    {
        "protocol_whitelist",
        "protocol_blacklist",
        "safe",
        "allowed_extensions",
        "allowed_segment_extensions",
        "extension_picky",
        "http_proxy",
        "ca_file",
        "cafile",
        "cert_file",
        "key_file",
    }
)


# Names that hold keys and passwords by convention, refused to a request even inside the
# roots (matched case-insensitively against the name of the file where it really lies).
# Hidden files and folders are refused before this list: `.env`, `.netrc`, `.pgpass`,
# `.git-credentials`, `.ssh/`, `.aws/`, `.docker/`, `.kube/` all start with a dot.
SECRET_NAMES = (
    "*.env",  # dotenv files named for their environment: prod.env
    "*.pem",  # PEM keys and certificates (TLS, cloud SDKs' service keys)
    "*.key",  # private keys: the TLS key a sink or the API uses
    "*.p12",  # PKCS #12 key stores (a key with its certificate)
    "*.pfx",  # the same, Windows' name
    "*.asc",  # OpenPGP armoured keys (FFmpeg would even render them as text: tty)
    "id_rsa*",  # OpenSSH's key files and their .pub beside them
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "credentials*",  # AWS's shared credentials file, Google's credentials.json
    "secret*",  # secrets.yaml, a Kubernetes Secret written out
)
# A line of a labels file that is some other kind of text (a labels file has one class
# name a line: COCO's, ImageNet's and Open Images' have no such line): a setting, as
# dotenv, shell, INI, properties, YAML and JSON write it (`NAME=value`, `export NAME=1`,
# `name = value`, `name: value`, `"name": value`), or PEM armour (`-----BEGIN ...`).
_SETTING = r"""(?:export\s+)?["']?[A-Za-z_][A-Za-z0-9_.-]*["']?\s*(?:=|:(?:\s|$)).*"""
_NOT_A_LABEL = re.compile(rf"{_SETTING}|-----[A-Z0-9 ]+-----.*", re.ASCII | re.DOTALL)
CERTIFICATE_BYTES = 1024 * 1024  # a PEM bundle of every public CA is about 200 KB
SECRET_BYTES = 4096  # a password or a token, with room to spare
# What to do about a path outside the roots, ending every such refusal's rule.
OUTSIDE_ROOTS_FIX = (
    "add its folder to server.file_roots in the config file and reload; a path in the "
    "config file itself is not limited by the roots"
)


class FileKind(StrEnum):
    """What a file is for; each kind has its own size cap (`limits.max_<kind>_bytes`)."""

    WORKFLOW = "workflow"
    LABELS = "labels"
    MODEL = "model"
    VIDEO = "video"  # streamed by FFmpeg, never read whole: no cap
    CERTIFICATE = "certificate"  # a sink's TLS CA, certificate or key; a camera's CA
    SECRET = "secret"  # a password read from a file (a mounted secret)
    BASELINE = "baseline"  # profiling.watch.baseline: `appliance trace fingerprint`'s
    STATE = "state"  # a document under server.state_dir (appliance/runtime/statefile.py)


def size_caps(limits: LimitsConfig) -> dict[FileKind, int]:
    return {
        FileKind.WORKFLOW: limits.max_workflow_bytes,
        FileKind.LABELS: limits.max_labels_bytes,
        FileKind.MODEL: limits.max_model_bytes,
        FileKind.BASELINE: limits.max_baseline_bytes,
        FileKind.STATE: limits.max_state_bytes,
        FileKind.CERTIFICATE: CERTIFICATE_BYTES,
        FileKind.SECRET: SECRET_BYTES,
    }


@dataclass(frozen=True, slots=True)
class FilePolicy:
    """Where files may be, how large, and the directory relative paths start from.

    `roots` None means the owner's policy (any path); `shown_roots`, the same roots as
    answers name them. `base` is the directory of the document that names the file (the
    config, or a workflow file). `denied`: files never read under this policy, absolute
    path -> what it is, for the message (the config file, a secret file it names).
    """

    base: Path
    limits: LimitsConfig
    roots: tuple[Path, ...] | None = None
    shown_roots: tuple[str, ...] = ()
    denied: Mapping[Path, str] = field(default_factory=dict)

    @classmethod
    def owner(cls, config: AppConfig) -> FilePolicy:
        return cls(config.base_dir, config.limits)

    @property
    def restricted(self) -> bool:
        return self.roots is not None

    @property
    def caps(self) -> dict[FileKind, int]:
        return size_caps(self.limits)

    def at(self, base: Path) -> FilePolicy:
        """The same policy for paths named by a document in `base`."""
        return replace(self, base=base)

    def path(self, name: Path | str, kind: FileKind, where: str = "") -> Path:
        """The checked, absolute path of `name`; FileAccessError or LimitError if refused."""
        resolved = self._resolve(name, kind, where)
        info = self._stat(resolved, name, kind, where)
        self._check_size(info.st_size, name, kind, where)
        return resolved

    def folder(self, name: Path | str, kind: FileKind, where: str = "") -> Path:
        """The checked, absolute path of a folder the appliance writes into (it may not
        exist yet): the same roots rule as `path`; FileAccessError if refused or a file."""
        resolved = self._resolve(name, kind, where)
        if resolved.exists() and not resolved.is_dir():
            raise FileAccessError(kind, str(name), "not a folder", where)
        return resolved

    def check_source(self, source: SourceConfig, where: str) -> None:
        """A video file goes through the rules (no cap: FFmpeg streams it), a camera's
        `tls.ca_file` as a certificate. Under the request policy, FFmpeg options that
        widen what it may open are refused (422): an HLS playlist or concat list may name
        any file, and these options decide whether FFmpeg follows (its
        `protocol_whitelist`, demuxers' `safe`, ...)."""
        if source_kind(source.url) == "file":
            self.path(source.url, FileKind.VIDEO, f"{where} source.url")
        if source.tls.ca_file is not None:
            self.path(source.tls.ca_file, FileKind.CERTIFICATE, f"{where} source.tls.ca_file")
        if self.roots is None:
            return
        unsafe = sorted(k for k in source.options if k.lower() in UNSAFE_FFMPEG_OPTIONS)
        if unsafe:
            problems = [
                f"source.options.{k}: not allowed over the API (it widens what FFmpeg "
                "may open); set it in the config file"
                for k in unsafe
            ]
            raise ConfigError(problems, where)

    def read_bytes(self, name: Path | str, kind: FileKind, where: str = "") -> bytes:
        """The file's bytes, read no further than its kind's cap."""
        resolved = self.path(name, kind, where)
        cap = self.caps.get(kind)
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(resolved, flags)
        except OSError as exc:
            raise FileAccessError(kind, str(name), f"cannot open: {exc.strerror}", where) from None
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(fd)
            self._check_not_denied(info, name, kind, where)  # swapped since the check
            if not stat.S_ISREG(info.st_mode):
                raise FileAccessError(kind, str(name), "not a regular file", where)
            data = f.read(-1 if cap is None else cap + 1)
        self._check_size(len(data), name, kind, where)
        return data

    def read_text(self, name: Path | str, kind: FileKind, where: str = "") -> str:
        data = self.read_bytes(name, kind, where)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            # The offset, not the bytes: they are the file's content.
            rule = f"not UTF-8 text (byte {exc.start})"
            raise FileAccessError(kind, str(name), rule, where) from None

    def read_labels(self, name: Path | str, where: str = "") -> str:
        """A labels file's text: one class name a line, at most `limits.max_labels` of them
        and each at most `limits.max_label_chars` long (LimitError, 413), and no line that
        is a setting or PEM armour (FileAccessError, 422: `_NOT_A_LABEL`), so that a
        labels file, whose names come back in answers, cannot carry a settings file, a
        key or an arbitrary text file back. The refusal names the line's number only."""
        text = self.read_text(name, FileKind.LABELS, where)
        labels = [label for line in text.splitlines() if (label := line.strip())]
        prefix = f"{where}: " if where else ""
        count, chars = self.limits.max_labels, self.limits.max_label_chars
        if len(labels) > count:
            message = f"{prefix}labels file {str(name)!r} has {len(labels)} labels"
            raise LimitError("limits.max_labels", count, message, status=413)
        for i, label in enumerate(labels, 1):
            if len(label) > chars:
                message = (
                    f"{prefix}labels file {str(name)!r}: label {i} has {len(label)} characters"
                )
                raise LimitError("limits.max_label_chars", chars, message, status=413)
        for i, line in enumerate(text.splitlines(), 1):
            if _NOT_A_LABEL.fullmatch(line.strip()):
                rule = (
                    f"not a labels file (line {i} is a setting or a key, not a class name: "
                    "one class name a line)"
                )
                raise FileAccessError(FileKind.LABELS, str(name), rule, where, 422)
        return text

    # -- the rules -------------------------------------------------------------------
    def _resolve(self, name: Path | str, kind: FileKind, where: str) -> Path:
        text = str(name)
        if not text.strip() or "\x00" in text:
            raise FileAccessError(kind, text, "not a file name", where)
        # `~` is the owner's shorthand; in a request it is just a directory name.
        p = Path(text).expanduser() if self.roots is None else Path(text)
        resolved = (p if p.is_absolute() else self.base / p).resolve()
        if self.roots is None:
            return resolved
        if not any(resolved.is_relative_to(r) for r in self.roots):
            rule, fix = self._outside_rule()
            raise FileAccessError(kind, text, rule, where, fix=fix)
        refused = self._secret_name(resolved)
        if refused is not None:
            raise FileAccessError(kind, text, f"{refused} is never read over the API", where)
        return resolved

    def _secret_name(self, resolved: Path) -> str | None:
        """Why a request may not have `resolved` by its name, or None: a hidden file or
        folder below its root, or a secret's conventional name (SECRET_NAMES). Below the
        root only: a root may itself lie in a hidden folder (`~/.config/appliance`), and
        the owner chose it. Of several roots that hold it, the nearest counts: a hidden
        folder the config names as a root is the owner's choice too."""
        roots = self.roots or ()
        root = max((r for r in roots if resolved.is_relative_to(r)), key=lambda r: len(r.parts))
        hidden = next((p for p in resolved.relative_to(root).parts if p.startswith(".")), None)
        if hidden is not None:
            return f"a hidden file or folder ({hidden!r})"
        name = resolved.name.lower()
        pattern = next((p for p in SECRET_NAMES if fnmatch.fnmatchcase(name, p)), None)
        return None if pattern is None else f"a file named like a secret ({pattern!r})"

    def _outside_rule(self) -> tuple[str, str]:
        """The refusal's rule and what to do about it (FileAccessError's `rule` and `fix`):
        the roots bind only paths named over the API, so a path the owner means may also
        go in the config file itself."""
        if not self.roots:
            rule = (
                "outside the file roots (there are none: server.file_roots is empty, or "
                "unset and the config names no models, workflows or video files)"
            )
            return rule, OUTSIDE_ROOTS_FIX
        roots = ", ".join(self.shown_roots)
        rule = f"outside the file roots ({roots}; server.file_roots)"
        return rule, f"put the file under one of them, or {OUTSIDE_ROOTS_FIX}"

    def _check_not_denied(
        self, info: os.stat_result, name: Path | str, kind: FileKind, where: str
    ) -> None:
        """Refuse a denied file by identity (device and inode), however it is reached: a
        symlink, a hard link, a secret mount's rotated target."""
        for path, what in self.denied.items():
            try:
                denied = path.stat()
            except OSError:
                continue  # not there: nothing to protect
            if (denied.st_dev, denied.st_ino) == (info.st_dev, info.st_ino):
                raise FileAccessError(kind, str(name), f"{what} is never read over the API", where)

    def _stat(self, resolved: Path, name: Path | str, kind: FileKind, where: str) -> os.stat_result:
        try:
            info = resolved.stat()
        except FileNotFoundError:
            raise FileAccessError(kind, str(name), "file not found", where, 422) from None
        except OSError as exc:
            raise FileAccessError(kind, str(name), f"cannot read: {exc.strerror}", where) from None
        self._check_not_denied(info, name, kind, where)
        if not stat.S_ISREG(info.st_mode):
            what = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise FileAccessError(kind, str(name), what, where)
        return info

    def _check_size(self, size: int, name: Path | str, kind: FileKind, where: str = "") -> None:
        cap = self.caps.get(kind)
        if cap is not None and size > cap:
            prefix = f"{where}: " if where else ""
            raise LimitError(
                f"limits.max_{kind.value}_bytes",
                cap,
                f"{prefix}{kind.value} file {str(name)!r} is over the size limit",
                status=413,
            )


def shown_path(config: AppConfig, path: Path | str, named: Path | None = None) -> str:
    """How answers name a path of the config, so that they do not spell out the host's
    layout: relative to the config's folder when it lies there, else as the config names
    it. `named`: the config's name for a folder an absolute `path` lies in (the traces
    folder, for a trace or dead-letter file)."""
    p = Path(path)
    if named is not None and p.is_absolute():
        folder = config.resolve(named)
        if p.is_relative_to(folder):
            p = named / p.relative_to(folder)
    if p.is_absolute() and p.is_relative_to(config.base_dir):
        p = p.relative_to(config.base_dir)
    return str(p) if p.is_absolute() else os.path.normpath(p)
