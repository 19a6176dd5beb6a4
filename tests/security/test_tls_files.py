"""`server.tls`'s files, read as the server reads them (appliance/server/tls.py): relative
to the config file, through the owner's file policy; every way they can fail is named by
its field, and `appliance doctor --config` says what the API would be served with. An
exposed bind without TLS is warned about, beside the tokenless warning."""

from __future__ import annotations

import asyncio
import logging
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from appliance.config import AppConfig, ConfigError, load_config
from appliance.errors import FileAccessError
from appliance.policy.files import FileKind
from appliance.policy.request_files import request_policy
from appliance.server.config import ServerConfig, TlsConfig
from appliance.server.connections import ConnectionGuard
from appliance.server.lifecycle import Listener, bind_policy
from appliance.server.tls import ApiTls
from appliance.tools.doctor import api_line, api_tls
from tests.server.live import write_yaml
from tests.support.tls import Issued, TestCA
from tests.support.warm_cli import run_appliance

PLAIN_WARNING = "serving plain HTTP on"
TLS = {"cert_file": "tls/cert.pem", "key_file": "tls/key.pem"}


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return TestCA()


def config_with_tls(folder: Path, tls: dict[str, str] | None = None) -> AppConfig:
    return load_config(write_yaml(folder, {"server": {"tls": tls or TLS}}, "config.yaml"))


def refusal(config: AppConfig) -> str:
    with pytest.raises(ConfigError) as refused:
        ApiTls(config, lambda: config)
    return str(refused.value)


def test_files_named_relative_to_the_config_load_whatever_the_working_folder(
    ca: TestCA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    issued = ca.issue("appliance.test")
    issued.write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    monkeypatch.chdir("/")
    tls = ApiTls(config_with_tls(tmp_path), lambda: config_with_tls(tmp_path))
    assert tls.served.serial == f"{issued.serial:X}"
    assert "CN=appliance.test" in tls.served.subject and not tls.served.expired


@pytest.mark.parametrize(
    ("break_it", "field", "why"),
    [
        (lambda d: (d / "tls/cert.pem").unlink(), "server.tls.cert_file", "file not found"),
        (lambda d: (d / "tls/key.pem").unlink(), "server.tls.key_file", "file not found"),
        (lambda d: (d / "tls/cert.pem").write_text("junk"), "server.tls.cert_file", "no PEM"),
        (lambda d: (d / "tls/key.pem").write_text("junk"), "server.tls.key_file", "no PEM"),
        (lambda d: (d / "tls/cert.pem").unlink() or (d / "tls/cert.pem").mkdir(),
         "server.tls.cert_file", "a directory"),
        (lambda d: (d / "tls/key.pem").write_bytes(encrypted_key()), "server.tls.key_file",
         "is encrypted"),
    ],
)  # fmt: skip
def test_files_that_cannot_be_served_are_refused_by_field(
    ca: TestCA, tmp_path: Path, break_it: Any, field: str, why: str
) -> None:
    ca.issue("appliance.test").write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    break_it(tmp_path)
    message = refusal(config_with_tls(tmp_path))
    assert field in message and why in message, message


def encrypted_key() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )


def test_a_key_that_is_not_the_certificates_is_refused(ca: TestCA, tmp_path: Path) -> None:
    ca.issue("one").write(tmp_path / "tls/cert.pem", tmp_path / "unused.pem")
    ca.issue("two").write(tmp_path / "other.pem", tmp_path / "tls/key.pem")
    message = refusal(config_with_tls(tmp_path))
    assert "server.tls.key_file" in message and "does not match the certificate" in message


def test_a_reload_onto_broken_files_keeps_serving_the_certificate_it_has(
    ca: TestCA, tmp_path: Path
) -> None:
    first = ca.issue("first")
    first.write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    tls = ApiTls(config_with_tls(tmp_path), lambda: config_with_tls(tmp_path))
    context = tls.context
    (tmp_path / "tls/key.pem").write_text("junk")
    done = tls.reload()
    assert not done.loaded and done.error is not None and "server.tls.key_file" in done.error
    assert done.served.serial == tls.served.serial == f"{first.serial:X}"
    second = ca.issue("second")
    second.write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    assert tls.reload().loaded and tls.served.serial == f"{second.serial:X}"
    assert tls.context is context  # the listener's context is never replaced


def test_an_expired_certificate_is_served_and_said_to_be(
    ca: TestCA, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = datetime.now(UTC)
    old = ca.issue("old", (now - timedelta(days=60), now - timedelta(days=1)))
    old.write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    with caplog.at_level(logging.WARNING, logger="appliance.server"):
        tls = ApiTls(config_with_tls(tmp_path), lambda: config_with_tls(tmp_path))
    assert tls.served.expired
    assert any("not valid now" in r.getMessage() for r in caplog.records)


# -- the bind warning -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "tls", "warned"),
    [("0.0.0.0", False, True), ("10.1.2.3", False, True), ("0.0.0.0", True, False),
     ("127.0.0.1", False, False), ("localhost", False, False)],
)  # fmt: skip
def test_an_exposed_bind_without_tls_is_warned_about(
    host: str, tls: bool, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    server = ServerConfig(token="a-token", tls=TlsConfig.model_validate(TLS) if tls else None)
    config = AppConfig(server=server)
    with caplog.at_level(logging.WARNING, logger="test.bind"):
        bind_policy(config, host, insecure=False, environ={}, log=logging.getLogger("test.bind"))
    lines = [r.getMessage() for r in caplog.records if PLAIN_WARNING in r.getMessage()]
    assert bool(lines) is warned
    assert all(host in line and "server.tls" in line for line in lines)


# -- doctor ---------------------------------------------------------------------------
def test_doctor_says_what_the_api_would_be_served_with(ca: TestCA, tmp_path: Path) -> None:
    plain = api_tls(load_config(write_yaml(tmp_path, {}, "plain.yaml")))
    assert plain == {"tls": False, "certificate": None, "problem": None}
    assert api_line(plain) == "plain HTTP (server.tls is not set)"
    issued = ca.issue("appliance.test")
    issued.write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    config = config_with_tls(tmp_path)
    served = api_tls(config)
    assert served["tls"] and served["problem"] is None
    assert served["certificate"]["serial"] == f"{issued.serial:X}"
    assert served["certificate"]["not_after"] in api_line(served)
    ca.issue("other").write(tmp_path / "other.pem", tmp_path / "tls/key.pem")
    broken = api_tls(config)
    assert broken["certificate"] is None and "does not match" in broken["problem"]
    assert "do not load" in api_line(broken)


def test_doctor_prints_it(ca: TestCA, tmp_path: Path) -> None:
    ca.issue("appliance.test").write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    config = write_yaml(tmp_path, {"server": {"tls": TLS}}, "config.yaml")
    done = run_appliance(["doctor", "--config", str(config)], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "api: over TLS (CN=appliance.test" in done.stdout


# -- the watch ------------------------------------------------------------------------
def kubelet_mount(folder: Path, issued: Issued, version: str) -> None:
    """A Secret's files as kubelet mounts them: `tls.crt` -> `..data/tls.crt`, `..data`
    -> `..<version>`, the new version swapped in by one rename of a symlink."""
    issued.write(folder / f"..{version}" / "tls.crt", folder / f"..{version}" / "tls.key")
    (folder / "..data_tmp").symlink_to(f"..{version}")
    (folder / "..data_tmp").rename(folder / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")


def test_a_renewed_secret_is_served_once_its_mount_changes(ca: TestCA, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    kubelet_mount(secret, ca.issue("first"), "v1")
    config = config_with_tls(
        tmp_path, {"cert_file": "secret/tls.crt", "key_file": "secret/tls.key"}
    )
    tls = ApiTls(config, lambda: config)
    assert not tls.changed()
    renewed = ca.issue("renewed")
    kubelet_mount(secret, renewed, "v2")
    assert tls.changed()

    async def watched() -> None:
        watch = asyncio.create_task(tls.watch(every_s=0.01))
        try:
            async with asyncio.timeout(10):
                while tls.served.serial != f"{renewed.serial:X}":
                    await asyncio.sleep(0.01)
        finally:
            watch.cancel()

    asyncio.run(watched())
    assert not tls.changed()  # read: the watch does not reload it again


def test_a_listener_that_cannot_listen_watches_no_files(ca: TestCA, tmp_path: Path) -> None:
    """The watch runs while the listener listens: a port in use starts none."""
    ca.issue("first").write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    config = config_with_tls(tmp_path)
    listener = Listener(
        web.Application(), ConnectionGuard(config.limits), tls=ApiTls(config, lambda: config)
    )

    async def listen_on(port: int) -> set[str]:
        try:
            with pytest.raises(ConfigError, match="cannot listen"):
                await listener.listen("127.0.0.1", port)
            return {task.get_name() for task in asyncio.all_tasks()}
        finally:
            await listener.close()

    with socket.create_server(("127.0.0.1", 0)) as taken:
        assert "tls-watch" not in asyncio.run(listen_on(taken.getsockname()[1]))


def test_files_that_do_not_load_are_tried_once_per_change(ca: TestCA, tmp_path: Path) -> None:
    ca.issue("first").write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    config = config_with_tls(tmp_path)
    tls = ApiTls(config, lambda: config)
    (tmp_path / "tls/key.pem").write_text("junk")
    assert tls.changed()
    assert tls.reload().error is not None
    assert not tls.changed()  # said once; the next change is tried again


def test_no_request_reads_the_tls_files_even_inside_the_file_roots(
    ca: TestCA, tmp_path: Path
) -> None:
    ca.issue("appliance.test").write(tmp_path / "tls/cert.pem", tmp_path / "tls/key.pem")
    path = write_yaml(tmp_path, {"server": {"tls": TLS, "file_roots": ["."]}}, "config.yaml")
    requests = request_policy(load_config(path), path)
    for name in ("tls/key.pem", "tls/cert.pem"):
        with pytest.raises(FileAccessError, match="never read over the API"):
            requests.read_bytes(tmp_path / name, FileKind.CERTIFICATE)
