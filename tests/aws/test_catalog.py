"""The catalog: exact facts, offline and refreshed from EC2 (moto serves AWS's own
DescribeInstanceTypes data), and a clear error for unknown types."""

from __future__ import annotations

import json

import pytest

from launcher import catalog
from launcher.catalog import NVSWITCH, PCIE_ONLY, InstanceFacts


@pytest.mark.parametrize("expected", [
    InstanceFacts("p4d.24xlarge", "A100", 8, 40960, 96, 1179648, "x86_64", 4, 4,
                  "4x 100 Gigabit", NVSWITCH, "NVLink3", 300.0, 32.7726, "2025-05", "built-in"),
    InstanceFacts("p5.48xlarge", "H100", 8, 81920, 192, 2097152, "x86_64", 32, 32,
                  "3200 Gigabit", NVSWITCH, "NVLink4", 450.0, 98.32, "2025-05", "built-in"),
    InstanceFacts("g6e.xlarge", "L40S", 1, 45776, 4, 32768, "x86_64", 0, 1,
                  "Up to 20 Gigabit", PCIE_ONLY, "PCIe Gen4 x16", 32.0, 1.861, "2025-05",
                  "built-in"),
    InstanceFacts("g6e.48xlarge", "L40S", 8, 45776, 192, 1572864, "x86_64", 4, 4,
                  "400 Gigabit", PCIE_ONLY, "PCIe Gen4 x16", 32.0, 30.13118, "2025-05",
                  "built-in"),
], ids=lambda f: f.instance_type)
def test_exact_facts(expected):
    assert catalog.lookup(expected.instance_type) == expected


def test_every_g6e_size_and_the_p_types_are_built_in():
    sizes = ["xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge",
             "48xlarge"]
    assert set(catalog.known_types()) >= {"p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge",
                                          *(f"g6e.{s}" for s in sizes)}
    assert not catalog.lookup("g6e.xlarge").efa_supported
    assert catalog.lookup("p4de.24xlarge").gpu_memory_mib == 81920


def test_unknown_type_names_the_known_ones(run_launch, offline_env):
    proc = run_launch("provision", "--instance", "p3.2xlarge", "--dry-run")
    assert proc.returncode == 2
    assert "instance type 'p3.2xlarge' is not in launch's catalog" in proc.stderr
    assert "p4d.24xlarge, p4de.24xlarge, p5.48xlarge, g6e.xlarge" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_catalog_offline_table(run_launch, offline_env):
    proc = run_launch("catalog", "p4d.24xlarge", "g6e.xlarge", check=True)
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["TYPE", "GPUS", "INTERCONNECT", "GPU", "LINK", "GB/s", "EFA",
                                "CARDS", "NETWORK", "$/HOUR"]
    assert lines[1].split() == ["p4d.24xlarge", "8x", "A100", "40", "GiB", "NVSwitch",
                                "NVLink3", "300", "4", "4", "4x", "100", "Gigabit", "32.77"]
    assert lines[2].split() == ["g6e.xlarge", "1x", "L40S", "44.7", "GiB", "PCIe", "only",
                                "PCIe", "Gen4", "x16", "32", "no", "1", "Up", "to", "20",
                                "Gigabit", "1.86"]
    assert "Source: built-in table (no AWS credentials or region" in proc.stdout


def test_built_in_table_matches_ec2_describe_instance_types(run_launch, aws_env):
    """moto bundles EC2's DescribeInstanceTypes answers: the table must agree with AWS."""
    live = json.loads(run_launch("catalog", "--json", check=True).stdout)
    offline = json.loads(run_launch("catalog", "--json", "--offline", check=True).stdout)
    assert live["source"] == ("built-in table, EC2 columns from DescribeInstanceTypes in "
                              "us-east-1")
    assert len(live["types"]) == len(catalog.known_types())
    for fresh, built_in in zip(live["types"], offline["types"]):
        assert fresh.pop("source").startswith("built-in + DescribeInstanceTypes")
        built_in.pop("source")
        assert fresh == built_in


def test_enrich_prefers_ec2_and_keeps_own_columns():
    facts = catalog.lookup("g6e.12xlarge")
    described = {
        "InstanceType": "g6e.12xlarge",
        "GpuInfo": {"Gpus": [{"Name": "L40S", "Count": 4, "MemoryInfo": {"SizeInMiB": 46068}}]},
        "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 2},
                        "MaximumNetworkCards": 2, "NetworkPerformance": "100 Gigabit"},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
    }
    fresh = catalog.enrich(facts, described, "eu-west-1")
    assert catalog.differences(facts, fresh) == [
        "gpu_memory_mib: built-in 45776, EC2 46068",
        "efa_max_interfaces: built-in 1, EC2 2",
        "network_cards: built-in 1, EC2 2",
    ]
    assert (fresh.interconnect, fresh.gpu_link_gbps, fresh.price_per_hour) == \
        (PCIE_ONLY, 32.0, 10.49264)
    assert fresh.source == "built-in + DescribeInstanceTypes eu-west-1"
