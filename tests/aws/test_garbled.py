"""Answers launch cannot use: an endpoint that speaks EC2's protocol but leaves out what it
should say (before anything is created), and a RunInstances answer without its instances
(after the security group was created). Either is one clear message, never a traceback; what
was created is cleaned up."""

from __future__ import annotations

import http.server
import threading
import urllib.parse

import pytest
from botocore.stub import ANY, Stubber

from launcher.provision.ledger import Ledger
from launcher.provision.provisioner import ProvisionFailed
from tests.aws.test_stubbed import _find_nothing, _make_security_group, client, plan_for, provisioner

NS = 'xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"'
ANSWERS = {
    "DescribeInstanceTypes": "<instanceTypeSet><item><instanceType>g6e.xlarge</instanceType>"
                             "</item></instanceTypeSet>",
    # An offering without its location: valid XML, valid to botocore, useless to launch.
    "DescribeInstanceTypeOfferings": "<instanceTypeOfferingSet><item><instanceType>g6e.xlarge"
                                     "</instanceType></item></instanceTypeOfferingSet>",
    "DescribeInstances": "<reservationSet/>",
    "DescribeAddresses": "<addressesSet/>",
    "DescribeAccountAttributes": "<accountAttributeSet/>",
}


class _PartialEc2(http.server.BaseHTTPRequestHandler):
    calls: list[str] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        action = urllib.parse.parse_qs(body).get("Action", ["?"])[0]
        self.calls.append(action)
        inner = ANSWERS.get(action)
        if inner is None:   # Service Quotas, the Price List API, anything else: garbage
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<<<not what you asked for")
            return
        text = (f'<?xml version="1.0" encoding="UTF-8"?><{action}Response {NS}>'
                f"<requestId>r-1</requestId>{inner}</{action}Response>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args):
        pass


@pytest.fixture
def partial_endpoint(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PartialEc2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    for key, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    _PartialEc2.calls = []
    yield url
    server.shutdown()


def test_a_partial_answer_while_planning_is_one_message(run_launch, partial_endpoint, tmp_path):
    args = ["provision", "--cluster", "odd", "--instance", "g6e.xlarge", "--key-name", "k",
            "--ami", "ami-0123456789abcdef0", "--ssh-cidr", "203.0.113.7/32", "--skip-setup"]
    proc = run_launch(*args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "launch: error: an AWS answer could not be used (KeyError: 'Location'); nothing was "
        "created. Run again with `launch --debug` for the traceback, and report it if it "
        "repeats\n")
    # Only reading calls were made; the garbled optional ones (quotas, prices) were tolerated.
    assert not [c for c in _PartialEc2.calls if c.startswith(("Create", "Run", "Allocate"))]
    assert "DescribeInstanceTypeOfferings" in _PartialEc2.calls
    debug = run_launch("--debug", *args)
    assert "Traceback" in debug.stderr and "KeyError: 'Location'" in debug.stderr


def test_a_partial_answer_after_creating_cleans_up(tmp_path):
    """RunInstances answers without its Instances (the model allows it): the run stops with
    the kind of failure named, and the security group it made is deleted."""
    ec2 = client("ec2")
    with Stubber(ec2) as stub:
        _find_nothing(stub)
        _make_security_group(stub)
        stub.add_response("run_instances", {"ReservationId": "r-1"})
        # The answer was not read: its instances, if any, are looked for by token.
        stub.add_response("describe_instances", {"Reservations": []},
                          expected_params={"Filters": ANY})
        stub.add_response("delete_security_group", {}, expected_params={"GroupId": "sg-0aaa"})
        worker = provisioner(ec2, plan_for("g6e.xlarge", 1), tmp_path, lost_launch_wait=0)
        with pytest.raises(ProvisionFailed) as caught:
            worker.run()
        stub.assert_no_pending_responses()
    assert str(caught.value) == (
        "provisioning cluster demo failed: unexpected KeyError: 'Instances'. cleaned up: "
        "nothing this run created remains")
    assert Ledger.load("demo", home=tmp_path).live() == []



class _ProxyPage(http.server.BaseHTTPRequestHandler):
    """What a captive portal or a wrong AWS_ENDPOINT_URL answers: a 200 with an HTML page."""

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        page = b"<html><body><h1>Welcome to the hotel network</h1></body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("command", [["status"],
                                     ["teardown", "--cluster", "c1", "--dry-run"]],
                         ids=lambda c: c[0])
def test_an_html_page_for_an_answer_is_one_message(run_launch, monkeypatch, command):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProxyPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = run_launch(*command, "--region", "us-east-1", env={
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}",
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    finally:
        server.shutdown()
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "AWS's answer could not be read" in proc.stderr, proc.stderr
    assert "AWS_ENDPOINT_URL or a proxy" in proc.stderr
