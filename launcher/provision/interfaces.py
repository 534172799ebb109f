"""The network interfaces of one instance, from the network cards EC2 describes.

AWS's guidance for multi-card EFA types (EC2 user guide, "Maximize network bandwidth on Amazon
EC2 instances with multiple network cards", and its P5 "use case 1: save IP addresses"): the
primary interface (card 0, device 0) carries the instance's IP address and cannot be EFA-only;
every further card gets one EFA-only interface, which has no IP address at all. So a p5 uses one
subnet address per instance instead of 32, and the EFA device count stays at the type's limit.

Where a card does not list `efa-only` the interface is a full EFA (EFA with ENA, device index 1,
as the older guidance had it), and it takes an address. Card 0 gets an EFA with ENA when it
supports EFA (p4d, p5, g6e); on types whose card 0 is ENA only (p6-b300) the primary is a plain
ENA interface and the EFA budget goes to the other cards. A single-card type keeps a single
interface: a second one would cost the instance its automatic public address and add no
bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.cluster.catalog import InstanceFacts, NetworkCard

ENA = "interface"
EFA = "efa"
EFA_ONLY = "efa-only"


@dataclass(frozen=True)
class NetworkInterface:
    card: int
    device: int
    kind: str        # ENA | EFA | EFA_ONLY (EC2's InterfaceType words)

    @property
    def efa(self) -> bool:
        return self.kind != ENA

    @property
    def has_ip(self) -> bool:
        return self.kind != EFA_ONLY

    @property
    def primary(self) -> bool:
        return self.card == 0 and self.device == 0


def _cards(facts: InstanceFacts) -> tuple[NetworkCard, ...]:
    if facts.cards:
        return tuple(sorted(facts.cards, key=lambda c: c.index))
    # EC2 not asked and no table row: every card is assumed to take a full EFA, which is valid
    # on every EFA type (it only spends more addresses than efa-only would).
    return tuple(NetworkCard(i, (ENA, EFA), 2) for i in range(max(facts.network_cards, 1)))


def layout(facts: InstanceFacts) -> tuple[NetworkInterface, ...]:
    if not facts.efa_supported:
        return (NetworkInterface(0, 0, ENA),)
    cards = _cards(facts)
    budget = facts.efa_max_interfaces
    out: list[NetworkInterface] = []
    if EFA in cards[0].interface_types:
        out.append(NetworkInterface(0, 0, EFA))
        budget -= 1
    else:
        out.append(NetworkInterface(0, 0, ENA))
    for card in cards[1:]:
        if budget <= 0:
            break
        if EFA_ONLY in card.interface_types:
            out.append(NetworkInterface(card.index, 0, EFA_ONLY))
        elif EFA in card.interface_types:
            out.append(NetworkInterface(card.index, 1, EFA))
        else:
            continue
        budget -= 1
    return tuple(out)


def addresses_per_instance(interfaces: tuple[NetworkInterface, ...]) -> int:
    return sum(1 for nic in interfaces if nic.has_ip)
