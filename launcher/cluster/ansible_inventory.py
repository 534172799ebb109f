"""Ansible's inventory loader, run as `python -m launcher.cluster.ansible_inventory PATH PATTERN`.

Prints one JSON object: {"hosts": [[name, variables], ...]} in the inventory's order for the
hosts PATTERN (an Ansible host pattern) selects, with "warnings", or {"error": message}. Run
in a child process by launcher/cluster/inventory.py: importing Ansible patches parts of the
interpreter (sys.intern among them) that torch later trips over.
"""

from __future__ import annotations

import json
import sys

# Variables Ansible adds to every host by itself: not the inventory's own.
MAGIC = {"ansible_config_file", "ansible_facts", "ansible_playbook_python", "ansible_version",
         "group_names", "groups", "inventory_dir", "inventory_file", "inventory_hostname",
         "inventory_hostname_short", "playbook_dir", "omit", "ansible_check_mode",
         "ansible_diff_mode", "ansible_forks", "ansible_inventory_sources",
         "ansible_run_tags", "ansible_skip_tags", "ansible_verbosity"}


def load(path: str, pattern: str) -> dict:
    import ansible.constants as C
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
    Display().warning = lambda msg, *a, **k: warnings.append(" ".join(str(msg).split()))
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
    return {"hosts": hosts, "warnings": warnings}


def main() -> int:
    path, pattern = sys.argv[1], sys.argv[2]
    print(json.dumps(load(path, pattern), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
