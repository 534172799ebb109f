"""Ansible's inventory loader, run as `python -m launcher.cluster.ansible_inventory PATH PATTERN`.

Prints one JSON object: {"hosts": [[name, variables], ...]} in the inventory's order for the
hosts PATTERN (an Ansible host pattern) selects, with "warnings", or {"error": message}. Run
in a child process by launcher/cluster/inventory.py: importing Ansible patches parts of the
interpreter (sys.intern among them) that torch later trips over.

The answer also says which inventory plugins parsed the sources ("parsed_by") and which vars
plugins gave variables ("vars_plugins"): launcher/cluster/inventory_cache.py keeps an answer only
when every one of them reads nothing but files (a script or aws_ec2 answers anew each time).
"""

from __future__ import annotations

import json
import re
import sys

# Ansible's own line when a plugin parsed a source (ansible/inventory/manager.py parse_source,
# shown at -vvv). Should it change, no plugin is recorded and nothing is cached: safe.
_PARSED = re.compile(r"Parsed (.*) inventory source with (\S+) plugin")

# Variables Ansible adds to every host by itself: not the inventory's own.
MAGIC = {"ansible_config_file", "ansible_facts", "ansible_playbook_python", "ansible_version",
         "group_names", "groups", "inventory_dir", "inventory_file", "inventory_hostname",
         "inventory_hostname_short", "playbook_dir", "omit", "ansible_check_mode",
         "ansible_diff_mode", "ansible_forks", "ansible_inventory_sources",
         "ansible_run_tags", "ansible_skip_tags", "ansible_verbosity"}


def load(path: str, pattern: str) -> dict:
    import ansible.constants as C
    import ansible.vars.plugins as vars_plugins
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.display import Display
    from ansible.vars.manager import VariableManager

    # As Ansible's own commands start (ansible/cli/__init__.py): without the collection loader
    # an inventory plugin named as documented (plugin: amazon.aws.aws_ec2, or
    # ansible.builtin.generator) is "unknown" and the inventory fails to parse.
    init_plugin_loader()
    # A file no inventory plugin can parse is an error, not a warning and no hosts.
    C.INVENTORY_UNPARSED_IS_FAILED = True
    C.INVENTORY_ANY_UNPARSED_IS_FAILED = True
    warnings: list[str] = []
    display = Display()
    display.warning = lambda msg, *a, **k: warnings.append(" ".join(str(msg).split()))
    parsed_by: list[str] = []
    display.vvv = lambda msg, *a, **k: parsed_by.extend(
        m[2] for m in [_PARSED.fullmatch(str(msg))] if m)
    used: set[str] = set()
    plugin_vars = vars_plugins.get_plugin_vars

    def recorded(loader, plugin, path, entities):
        used.add(str(getattr(plugin, "ansible_name", None) or plugin))
        return plugin_vars(loader, plugin, path, entities)

    vars_plugins.get_plugin_vars = recorded
    try:
        loader = DataLoader()
        manager = InventoryManager(loader=loader, sources=[path])
        variables = VariableManager(loader=loader, inventory=manager)
        hosts = []
        for host in manager.get_hosts(pattern):
            found = variables.get_vars(host=host, include_hostvars=False)
            hosts.append([host.name, {k: v for k, v in found.items() if k not in MAGIC}])
    except AnsibleError as err:
        return {"error": " ".join(str(getattr(err, "message", err)).split())[:500]}
    except (RecursionError, UnicodeError, ValueError, TypeError) as err:
        return {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    return {"hosts": hosts, "warnings": warnings, "parsed_by": sorted(set(parsed_by)),
            "vars_plugins": sorted(used)}


def main() -> int:
    path, pattern = sys.argv[1], sys.argv[2]
    print(json.dumps(load(path, pattern), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
