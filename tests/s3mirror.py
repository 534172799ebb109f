"""The checkpoint mirror against S3 for runs on any backend: moto's server where the run's nodes
reach it (this machine's loopback, or a lab's bridge address), a bucket, and the recipe keys
that point a run's mirror there."""

from __future__ import annotations

import contextlib
from pathlib import Path

import boto3

from tests.aws.conftest import REGION, moto_server

BUCKET = "launch-mirror"


@contextlib.contextmanager
def s3_for_nodes(folder: Path, host: str):
    """(the recipe's env for the nodes' boto3, an S3 client here) while moto's server runs on
    `host`, with an empty bucket."""
    folder.mkdir(parents=True, exist_ok=True)
    server = moto_server(folder, host)
    url = next(server)
    try:
        env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
               "AWS_EC2_METADATA_DISABLED": "true"}
        client = boto3.client("s3", region_name=REGION, endpoint_url=url,
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=BUCKET)
        yield env, client
    finally:
        server.close()


def mirrored(client, prefix: str = "") -> list[str]:
    """The keys the mirror put in the bucket."""
    found = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(item["Key"] for item in found)
