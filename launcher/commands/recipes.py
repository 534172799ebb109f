"""`launch recipes [--json]`: the recipes that ship with launch, which `launch run NAME` and
`launch init --recipe NAME` take by name."""

from __future__ import annotations

import argparse
import json

from launcher.core import bundled
from launcher.core.table import format_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "recipes", help="list the recipes that ship with launch (launch run NAME takes them)",
        description="The ready recipes inside the launch package, one line each: what they "
                    "train, on what. `launch run NAME` runs one by name; `launch init --recipe "
                    "NAME` copies one into a folder to edit.")
    parser.add_argument("--json", action="store_true",
                        help="print [{name, description, usage, path}] as JSON")
    parser.set_defaults(func=run)


def listing() -> list[dict]:
    rows = []
    for name in bundled.recipe_names():
        path = bundled.bundled_recipe(name)
        header = bundled.recipe_header(path)
        rows.append({"name": name, "description": header.description, "usage": header.usage,
                     "path": str(path)})
    return rows


def run(args: argparse.Namespace) -> int:
    rows = listing()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(format_table(("recipe", "what it trains, where"),
                       [(r["name"], r["description"]) for r in rows]), end="")
    print(f"\nin {bundled.recipes_dir()}\n"
          "run one:  launch run NAME --local  (this machine), or  launch run NAME -i INVENTORY\n"
          "edit one: launch init --recipe NAME [DIR]  (writes DIR/recipe.yml and an inventory)")
    return 0
