"""moto in server mode: a real HTTP EC2/SSM endpoint that boto3 reaches through AWS_ENDPOINT_URL,
exactly as the CLI would reach AWS (no patching of boto3 or of launch)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

MOTO_SERVER = Path(sys.executable).with_name("moto_server")
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path, monkeypatch):
    """Every test keeps its ledgers, inventories and known_hosts in its own LAUNCH_HOME (an
    exported LAUNCH_HOME, a real cluster's, is never read or written), and sees no AWS_*
    variable, AWS config file or instance metadata of the caller: `aws_env` and `offline_env`
    set exactly what a test needs. The CLI run by `run_launch` inherits this environment."""
    home = tmp_path / "launch-home"
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return home


@pytest.fixture(scope="session")
def moto_url(tmp_path_factory):
    yield from moto_server(tmp_path_factory.mktemp("moto"), "127.0.0.1")


def moto_server(folder: Path, host: str):
    """moto's server on `host` (a lab's bridge address: its hosts reach it there), its URL
    yielded while it runs."""
    if not MOTO_SERVER.exists():
        pytest.fail(f"{MOTO_SERVER} is missing: install the test extras (moto[server])")
    with socket.socket() as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    log = folder / "moto.log"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
           # The caller's AWS profile or endpoint must not reach moto's own boto3 calls.
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
           # Real EC2 rejects unknown key pairs at RunInstances; moto does only when asked to.
           "MOTO_ENABLE_KEYPAIR_VALIDATION": "true"}
    with open(log, "w") as out:
        proc = subprocess.Popen([str(MOTO_SERVER), "-H", host, "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://{host}:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"moto_server exited: {log.read_text()}")
                time.sleep(0.05)
        else:
            pytest.fail(f"moto_server did not answer on {url}: {log.read_text()}")
        yield url
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def aws_env(moto_url, tmp_path, monkeypatch):
    """Environment for the CLI and for this process's boto3: fake credentials, moto endpoint.

    moto's state is reset per test, so every test starts from an empty account.
    """
    urllib.request.urlopen(urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST"))
    env = {
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        # Nothing answers here: a test that forgets --ssh-cidr fails fast instead of reaching out.
        "LAUNCH_PUBLIC_IP_URL": f"http://127.0.0.1:{free_port()}/",
    }
    for key in ("AWS_PROFILE", "AWS_REGION", "AWS_SESSION_TOKEN", "AWS_MAX_ATTEMPTS",
                "AWS_RETRY_MODE", "AWS_CA_BUNDLE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def ec2(aws_env):
    return boto3.client("ec2", region_name=REGION)


@pytest.fixture
def key_pair(ec2):
    ec2.create_key_pair(KeyName="launch-test")
    return "launch-test"


@pytest.fixture
def ubuntu_ami(ec2):
    """An Ubuntu image from moto's bundled catalogue (moto serves no Canonical SSM parameters)."""
    images = ec2.describe_images(Filters=[{"Name": "name", "Values": ["ubuntu/images/*"]},
                                          {"Name": "architecture", "Values": ["x86_64"]}])
    return sorted(images["Images"], key=lambda i: i["ImageId"])[0]["ImageId"]


@pytest.fixture
def offline_env(tmp_path, monkeypatch):
    """No AWS credentials anywhere: what a dry run on a laptop without AWS setup sees."""
    env = {
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "LAUNCH_PUBLIC_IP_URL": f"http://127.0.0.1:{free_port()}/",
    }
    for key in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env

