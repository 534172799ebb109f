"""On-demand prices from the AWS Price List API (`pricing` client), when it answers.

The Price List query API lives in a few regions only (us-east-1 among them) and answers for
every region; its products carry the region code, so one filter set finds the Linux, shared
tenancy, on-demand price of a type in the cluster's region. Any failure (no permission, no
network, an endpoint that does not serve it) returns None and the caller keeps the table's price,
labelled as such.
"""

from __future__ import annotations

import json
from typing import Any

from launcher.cluster.catalog import Price
from launcher.provision import aws

SOURCE = "AWS Price List API"


def product_filters(instance_type: str, region: str) -> list[dict[str, str]]:
    wanted = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "licenseModel": "No License required",
        "capacitystatus": "Used",
        "marketoption": "OnDemand",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in wanted.items()]


def parse_price(items: list[str], region: str) -> Price | None:
    """The hourly USD price of the first on-demand product in a GetProducts answer."""
    for raw in items:
        item = json.loads(raw) if isinstance(raw, str) else raw
        for term in (item.get("terms") or {}).get("OnDemand", {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                usd = (dim.get("pricePerUnit") or {}).get("USD")
                if dim.get("unit") == "Hrs" and usd and float(usd) > 0:
                    published = str(item.get("publicationDate") or "")[:10] or "undated"
                    return Price(float(usd), region, SOURCE, published)
    return None


def lookup(pricing: Any, instance_type: str, region: str) -> tuple[Price | None, str]:
    """(price, "") or (None, why it is not known)."""
    try:
        answer = pricing.get_products(ServiceCode="AmazonEC2",
                                      Filters=product_filters(instance_type, region),
                                      MaxResults=10)
    except aws.OPTIONAL_ERRORS as err:
        return None, f"{SOURCE} did not answer ({aws.short_reason(err)})"
    try:
        price = parse_price(answer.get("PriceList") or [], region)
    except (ValueError, TypeError, AttributeError) as err:
        return None, f"{SOURCE} answered something unreadable ({err})"
    if price is None:
        return None, f"{SOURCE} lists no Linux on-demand price for {instance_type} in {region}"
    return price, ""
