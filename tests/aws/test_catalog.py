"""The catalog: exact facts, offline and refreshed from EC2 (moto serves AWS's own
DescribeInstanceTypes data), any type EC2 knows, and prices that always carry their source."""

from __future__ import annotations

import json

import pytest

from launcher.cluster import catalog
from launcher.cluster.catalog import NVSWITCH, PCIE_ONLY, InstanceFacts, NetworkCard, Price

EFA_CARD = ("interface", "efa", "efa-only")
VANTAGE = ("instances.vantage.sh copy of the AWS price list", "2026-08-26")


def cards(n, types, per_card):
    return tuple(NetworkCard(i, types, per_card) for i in range(n))


@pytest.mark.parametrize("expected", [
    InstanceFacts("p4d.24xlarge", "A100", 8, 40960, 96, 1179648, "x86_64", 4, 4,
                  "4x 100 Gigabit", NVSWITCH, "NVLink3", 300.0,
                  Price(21.957642, "us-east-1", *VANTAGE), cards(4, EFA_CARD, 15)),
    InstanceFacts("p5.48xlarge", "H100", 8, 81920, 192, 2097152, "x86_64", 32, 32,
                  "3200 Gigabit", NVSWITCH, "NVLink4", 450.0,
                  Price(55.04, "us-east-1", *VANTAGE), cards(32, EFA_CARD, 2)),
    InstanceFacts("p5en.48xlarge", "H200", 8, 144384, 192, 2097152, "x86_64", 16, 16,
                  "3200 Gigabit", NVSWITCH, "NVLink4", 450.0,
                  Price(63.296, "us-east-1", *VANTAGE), cards(16, EFA_CARD, 4)),
    InstanceFacts("p5e.48xlarge", "H200", 8, 144384, 192, 2097152, "x86_64", 32, 32,
                  "3200 Gigabit", NVSWITCH, "NVLink4", 450.0, None, cards(32, EFA_CARD, 2)),
    InstanceFacts("p5.4xlarge", "H100", 1, 81920, 16, 262144, "x86_64", 1, 1, "100 Gigabit",
                  PCIE_ONLY, "PCIe Gen5 x16", 64.0, Price(6.88, "us-east-1", *VANTAGE),
                  cards(1, EFA_CARD, 4)),
    InstanceFacts("p6-b200.48xlarge", "B200", 8, 183359, 192, 2097152, "x86_64", 8, 8,
                  "3200 Gigabit", NVSWITCH, "NVLink5", 900.0,
                  Price(113.9328, "us-east-1", *VANTAGE), cards(8, EFA_CARD, 4)),
    InstanceFacts("g6e.xlarge", "L40S", 1, 45776, 4, 32768, "x86_64", 0, 1,
                  "Up to 20 Gigabit", PCIE_ONLY, "PCIe Gen4 x16", 32.0,
                  Price(1.861, "us-east-1", "EC2 on-demand price page", "2025-05"),
                  cards(1, ("interface",), 4)),
    InstanceFacts("g6e.48xlarge", "L40S", 8, 45776, 192, 1572864, "x86_64", 4, 4,
                  "400 Gigabit", PCIE_ONLY, "PCIe Gen4 x16", 32.0,
                  Price(30.13118, "us-east-1", "EC2 on-demand price page", "2025-05"),
                  cards(4, EFA_CARD, 10)),
], ids=lambda f: f.instance_type)
def test_exact_facts(expected):
    assert catalog.lookup(expected.instance_type) == expected


def test_p_prices_are_the_june_2025_cut_ones():
    """AWS cut P4 prices by up to 33% and P5 by up to 45% in June 2025: the table's P prices
    (written by hand from the public source named in launcher/cluster/catalog.py) are below the old
    list prices by about that much."""
    before = {"p4d.24xlarge": 32.7726, "p4de.24xlarge": 40.9657, "p5.48xlarge": 98.32}
    cut = {t: 1 - catalog.lookup(t).price_per_hour / old for t, old in before.items()}
    assert cut == pytest.approx({"p4d.24xlarge": 0.33, "p4de.24xlarge": 0.33,
                                 "p5.48xlarge": 0.44}, abs=0.01)
    for facts in catalog.BUILTIN.values():
        if facts.price is not None:
            assert facts.price.region == "us-east-1" and facts.price.source and \
                facts.price.as_of[:4].isdigit()


def test_every_g6e_size_and_the_p_types_are_built_in():
    sizes = ["xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge",
             "48xlarge"]
    assert set(catalog.known_types()) >= {
        "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
        "p5.4xlarge", "p6-b200.48xlarge", *(f"g6e.{s}" for s in sizes)}
    assert not catalog.lookup("g6e.xlarge").efa_supported
    assert catalog.lookup("p4de.24xlarge").gpu_memory_mib == 81920


def test_unknown_type_offline_says_ec2_was_not_asked(run_launch, offline_env):
    proc = run_launch("provision", "--instance", "p3.2xlarge", "--dry-run")
    assert proc.returncode == 2
    assert "instance type 'p3.2xlarge' is not in launch's built-in table" in proc.stderr
    assert "with AWS credentials and a region, any type EC2 DescribeInstanceTypes describes " \
           "can be used" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_catalog_offline_table(run_launch, offline_env):
    proc = run_launch("catalog", "p4d.24xlarge", "g6e.xlarge", "p5e.48xlarge", check=True)
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["TYPE", "GPUS", "INTERCONNECT", "GPU", "LINK", "GB/s", "EFA",
                                "CARDS", "NETWORK", "$/HOUR"]
    assert lines[1].split() == ["p4d.24xlarge", "8x", "A100", "40", "GiB", "NVSwitch",
                                "NVLink3", "300", "4", "4", "4x", "100", "Gigabit", "21.96"]
    assert lines[2].split() == ["g6e.xlarge", "1x", "L40S", "44.7", "GiB", "PCIe", "only",
                                "PCIe", "Gen4", "x16", "32", "no", "1", "Up", "to", "20",
                                "Gigabit", "1.86"]
    assert lines[3].split()[-1] == "-"
    assert lines[4:8] == [
        "GPU link: peak per GPU, one direction. $/hour, Linux:",
        "  us-east-1 on-demand list price, instances.vantage.sh copy of the AWS price list, "
        "2026-08-26: p4d.24xlarge",
        "  us-east-1 on-demand list price, EC2 on-demand price page, 2025-05: g6e.xlarge",
        "  no on-demand list price known: p5e.48xlarge"]
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


def test_any_type_ec2_knows_is_listed_with_unknown_interconnect(run_launch, aws_env):
    data = json.loads(run_launch("catalog", "--json", "g5.48xlarge", "p5en.48xlarge",
                                 check=True).stdout)
    g5, p5en = data["types"]
    # From DescribeInstanceTypes alone; what AWS does not publish stays unknown.
    assert (g5["gpu_model"], g5["gpu_count"], g5["interconnect"], g5["gpu_link_gbps"],
            g5["price"], g5["source"]) == ("A10G", 8, "unknown", None, None,
                                           "DescribeInstanceTypes us-east-1")
    assert p5en["interconnect"] == "NVSwitch" and p5en["efa_max_interfaces"] == 16
    refused = run_launch("catalog", "p9.nonesuch")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "p9.nonesuch" in refused.stderr


def test_enrich_prefers_ec2_and_keeps_own_columns():
    facts = catalog.lookup("g6e.12xlarge")
    described = {
        "InstanceType": "g6e.12xlarge",
        "GpuInfo": {"Gpus": [{"Name": "L40S", "Count": 4, "MemoryInfo": {"SizeInMiB": 46068}}]},
        "NetworkInfo": {"EfaSupported": True, "EfaInfo": {"MaximumEfaInterfaces": 2},
                        "MaximumNetworkCards": 2, "NetworkPerformance": "100 Gigabit",
                        "NetworkCards": [{"NetworkCardIndex": i, "MaximumNetworkInterfaces": 10,
                                          "InterfaceTypes": ["interface", "efa"]}
                                         for i in range(2)]},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "VCpuInfo": {"DefaultVCpus": 48}, "MemoryInfo": {"SizeInMiB": 393216},
    }
    fresh = catalog.enrich(facts, described, "eu-west-1")
    assert catalog.differences(facts, fresh) == [
        "gpu_memory_mib: built-in 45776, EC2 46068",
        "efa_max_interfaces: built-in 1, EC2 2",
        "network_cards: built-in 1, EC2 2",
    ]
    assert fresh.cards == cards(2, ("interface", "efa"), 10)
    assert (fresh.interconnect, fresh.gpu_link_gbps, fresh.price_per_hour) == \
        (PCIE_ONLY, 32.0, 10.49264)
    assert fresh.source == "built-in + DescribeInstanceTypes eu-west-1"
