"""`launch recipes`, `launch init` and `launch setup --syntax-check` through the real CLI, and
the rule that launch finds its files through the package, never relative to a checkout."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from launcher.core import bundled

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "launcher" / "recipes"
EXAMPLE_INVENTORY = REPO / "launcher" / "examples" / "inventory.example.yml"

# Written by hand from each recipe's header comment.
WHAT_THEY_TRAIN = {
    "vit-tiny-local": "The README's demo: a ViT-Tiny trained on scikit-learn's bundled 8x8 digits "
                      "across 2 torchrun \"nodes\" on one machine, gloo on CPU.",
    "vit-b16-p4d": "ViT-B/16 (86 M parameters) on p4d.24xlarge: 8x A100 40 GB on NVSwitch per "
                   "node, 4x 100 Gb/s EFA between nodes.",
    "vit-b16-g6e": "ViT-B/16 (86 M parameters) on g6e.12xlarge: 4x L40S per node on PCIe only "
                   "(no NVLink), one 100 Gb/s EFA interface between nodes.",
}


def next_commands(stdout: str) -> list[list[str]]:
    """The `launch ...` lines `launch init` printed under "next:", as argv without "launch"."""
    tail = stdout.split("\nnext:\n", 1)[1]
    found = []
    for line in tail.splitlines():
        command = line.split("   # ", 1)[0].strip()
        if command.startswith("launch "):
            found.append(shlex.split(command)[1:])
    return found


def test_recipes_lists_every_bundled_recipe_with_what_it_trains(run_launch):
    proc = run_launch("recipes", check=True)
    names = sorted(p.stem for p in RECIPES.glob("*.yml"))
    assert names == sorted(WHAT_THEY_TRAIN)
    rows = proc.stdout.splitlines()
    assert rows[0].split() == ["recipe", "what", "it", "trains,", "where"]
    for name, row in zip(names, rows[1:]):
        assert row.split(None, 1) == [name, WHAT_THEY_TRAIN[name]]
    assert f"in {RECIPES}" in proc.stdout


def test_recipes_json_gives_each_recipe_its_file_and_how_it_runs(run_launch):
    listed = json.loads(run_launch("recipes", "--json", check=True).stdout)
    assert [r["name"] for r in listed] == sorted(WHAT_THEY_TRAIN)
    for entry in listed:
        assert entry["description"] == WHAT_THEY_TRAIN[entry["name"]]
        assert Path(entry["path"]) == RECIPES / f"{entry['name']}.yml"
        # The line the recipe's author wrote to show how it runs names the recipe itself.
        assert entry["usage"].startswith("launch run ") and entry["name"] in entry["usage"].split()
    usage = {r["name"]: r["usage"] for r in listed}
    assert usage["vit-tiny-local"] == "launch run --local --nodes 2 vit-tiny-local"
    assert usage["vit-b16-p4d"] == "launch run --nodes 2 vit-b16-p4d -i inventory.yml"


def test_init_writes_the_cpu_demo_and_an_inventory_and_its_next_commands_work(run_launch, tmp_path):
    proc = run_launch("init", "proj", check=True)
    recipe, inventory = tmp_path / "proj" / "recipe.yml", tmp_path / "proj" / "inventory.yml"
    # The bundled recipe, comments and all, named after its folder: runs can be told apart.
    bundled_text = (RECIPES / "vit-tiny-local.yml").read_text()
    assert recipe.read_text() == bundled_text.replace("\nname: vit-tiny-local\n",
                                                      "\nname: proj\n")
    assert inventory.read_bytes() == EXAMPLE_INVENTORY.read_bytes()
    assert sorted(p.name for p in (tmp_path / "proj").iterdir()) == ["inventory.yml", "recipe.yml"]
    assert "wrote proj/recipe.yml " in proc.stdout and "wrote proj/inventory.yml " in proc.stdout
    commands = next_commands(proc.stdout)
    assert commands == [
        ["run", "--local", "--nodes", "2", "proj/recipe.yml", "--dry-run"],
        ["run", "--local", "--nodes", "2", "proj/recipe.yml"],
        ["setup", "-i", "proj/inventory.yml"],
        ["run", "--nodes", "2", "proj/recipe.yml", "-i", "proj/inventory.yml"],
    ]
    # The first command it tells a newcomer to type works as printed, on the copy.
    plan = run_launch(*commands[0], check=True).stdout
    assert "recipe proj (proj/recipe.yml)" in plan
    assert "2 node(s) x 1 process(es) = world size 2" in plan


def test_init_with_a_cluster_recipe_points_at_the_inventory(run_launch, tmp_path):
    proc = run_launch("init", "--recipe", "vit-b16-p4d", check=True)
    # Into "here": the recipe takes the name of the folder it is in.
    assert yaml.safe_load((tmp_path / "recipe.yml").read_text())["name"] == tmp_path.name
    commands = next_commands(proc.stdout)
    assert commands[0] == ["run", "--nodes", "2", "recipe.yml", "-i", "inventory.yml",
                           "--dry-run"]
    assert ["setup", "-i", "inventory.yml"] in commands
    # The template's hosts, planned without a connection: 2 x 8 A100 ranks.
    plan = run_launch(*commands[0], check=True).stdout
    assert "world size 16" in plan
    assert "node gpu-a (54.210.10.11, head" in plan and "node gpu-b (54.210.10.12" in plan


def test_init_never_overwrites_and_then_writes_nothing(run_launch, tmp_path):
    (tmp_path / "inventory.yml").write_text("all: {hosts: {mine: {}}}\n")
    proc = run_launch("init")
    assert proc.returncode == 2
    assert "launch: error: inventory.yml already exists: launch init never overwrites" \
        in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "inventory.yml").read_text() == "all: {hosts: {mine: {}}}\n"
    # Refused before writing anything: no recipe.yml beside the user's inventory either.
    assert not (tmp_path / "recipe.yml").exists()


def test_init_refuses_an_unknown_recipe_and_a_file_as_folder(run_launch, tmp_path):
    proc = run_launch("init", "new", "--recipe", "vit-huge")
    assert proc.returncode == 2
    assert ("--recipe vit-huge: no bundled recipe of that name (there are vit-b16-g6e, "
            "vit-b16-p4d, vit-tiny-local") in proc.stderr
    assert not (tmp_path / "new").exists()
    (tmp_path / "notes").write_text("x")
    proc = run_launch("init", "notes")
    assert proc.returncode == 2 and "notes is a file, not a folder" in proc.stderr


@pytest.mark.parametrize("folder, name", [
    ("exp 1", "exp-1"), ("résumé", "r-sum"), ("..", None),
    ("a$(touch pwned)`id`", "a-touch-pwned-id"),
    ("-x", "x"), ("1e3", "1e3"), ("true", "true"),
])
def test_init_names_the_recipe_after_its_folder_and_its_next_lines_paste_safely(
        run_launch, tmp_path, folder, name):
    """The name is the folder's own where that is a recipe name, else its usable part; every
    printed command, pasted into a shell, runs exactly the argv it shows and nothing else."""
    work = tmp_path / "work" / "sub"
    work.mkdir(parents=True)
    proc = run_launch("init", "--", folder, cwd=work, check=True)
    written = (work / folder / "recipe.yml").resolve()
    expected = name or written.parent.name
    assert yaml.safe_load(written.read_text())["name"] == expected
    lines = [line.split("   # ", 1)[0].strip()
             for line in proc.stdout.split("\nnext:\n", 1)[1].splitlines()]
    commands = [line for line in lines if line.startswith("launch ")]
    assert commands
    for line in commands:
        shown = shlex.split(line)
        pasted = subprocess.run(["bash", "-c", f"launch() {{ printf '%s\\0' \"$@\"; }}; {line}"],
                                cwd=work, capture_output=True, text=True, check=True)
        assert pasted.stdout.split("\0")[:-1] == shown[1:]
        recipe_args = [a for a in shown if a.endswith("recipe.yml")]
        assert all(Path(work, a).resolve() == written for a in recipe_args)
        assert not any(a.startswith("-") and a.endswith(".yml") for a in shown)
    assert not (work / "pwned").exists()


@pytest.mark.parametrize("folder", ["new\nline", "tab\there", "esc\x1b[31m", "del\x7f"])
def test_init_refuses_control_characters_in_the_folder_name(run_launch, tmp_path, folder):
    proc = run_launch("init", folder)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "the folder name holds control characters" in proc.stderr
    assert not any(p.name.startswith(folder[:3]) for p in tmp_path.iterdir())


def test_init_into_a_dangling_link_or_a_too_long_path_says_why_and_writes_nothing(
        run_launch, tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    proc = run_launch("init", "gone")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "gone is a symbolic link to" in proc.stderr and "which does not exist" in proc.stderr
    assert not (tmp_path / "nowhere").exists()
    for long in ("x" * 300, "/".join(["y" * 200] * 30)):
        proc = run_launch("init", long)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "cannot write there (File name too long)" in proc.stderr
        assert long.split("/")[0] not in os.listdir(tmp_path)


def test_init_into_a_read_only_folder_says_why_and_leaves_nothing(run_launch, tmp_path):
    """A read-only file system (root writes through permission bits, so chmod would not do):
    the folder launch init made on the way is removed again."""
    ro = tmp_path / "ro"
    ro.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        proc = run_launch("init", "ro/sub/proj")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "ro/sub: cannot write there (Read-only file system); launch init wrote nothing" \
            in proc.stderr
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert list(ro.iterdir()) == []


def test_init_dry_run_writes_nothing(run_launch, tmp_path):
    proc = run_launch("init", "proj", "--dry-run", check=True)
    assert "would write proj/recipe.yml: recipe proj, a copy of the bundled recipe " \
        "vit-tiny-local" in proc.stdout
    assert not (tmp_path / "proj").exists()


def test_setup_syntax_check_finds_the_bundled_playbooks(run_launch, tmp_path):
    run_launch("init", check=True)
    proc = run_launch("setup", "-i", "inventory.yml", "--syntax-check", check=True)
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"launch setup --syntax-check: {REPO / 'launcher/playbooks/site.yml'} "
                        f"with {tmp_path / 'inventory.yml'}")
    assert "  playbook: site.yml" in lines and lines[-1] == "syntax check passed"
    # It reached no host: nothing was kept as a setup run.
    assert not (tmp_path / "launch-home" / "setup").exists()


def test_setup_syntax_check_names_an_unreadable_inventory(run_launch, tmp_path):
    proc = run_launch("setup", "-i", "missing.yml", "--syntax-check")
    assert proc.returncode == 2
    assert f"{tmp_path / 'missing.yml'}: cannot read the inventory" in proc.stderr


# Source lines allowed to use __file__ (none: even the node code beside `launcher` is found
# through importlib.resources, launcher/core/node_code.py).
ALLOWED_FILE_LOOKUPS: set[tuple[str, str]] = set()


def test_nothing_in_launcher_locates_files_relative_to_the_checkout():
    offenders = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        function = "<module>"
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = re.match(r"\s*def (\w+)", line)
            if match and not line.startswith("        "):
                function = match.group(1)
            if re.search(r"__file__|parents\[|sys\.argv\[0\]", line) and \
                    (rel, function) not in ALLOWED_FILE_LOOKUPS:
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "use launcher.core.bundled (importlib.resources) instead:\n" + \
        "\n".join(offenders)


def test_bundled_lookups_name_the_files_in_the_package():
    assert bundled.playbooks_dir() == REPO / "launcher" / "playbooks"
    assert (bundled.playbooks_dir() / "site.yml").is_file()
    assert bundled.example_inventory() == EXAMPLE_INVENTORY
    assert bundled.bundled_recipe("vit-tiny-local") == RECIPES / "vit-tiny-local.yml"
    assert bundled.bundled_recipe("vit-tiny-local.yml") == RECIPES / "vit-tiny-local.yml"
    # A path is not a name: `launch run ../x` must never reach into the package.
    assert bundled.bundled_recipe("../recipes/vit-tiny-local") is None


@pytest.mark.parametrize("text, description, usage", [
    ("name: x\n", "", None),
    ("# One line.\n# More prose.\n#\n#   launch run x --local\nname: x\n", "One line.",
     "launch run x --local"),
    ("# Runs on 2 nodes: fast\n# and cheap. Then more.\nname: x\n",
     "Runs on 2 nodes: fast and cheap.", None),
])
def test_recipe_header_reads_the_first_sentence_and_the_run_line(tmp_path, text, description,
                                                                 usage):
    path = tmp_path / "x.yml"
    path.write_text(text)
    assert bundled.recipe_header(path) == bundled.RecipeHeader(description, usage)
