"""``ray-tpu:cluster``: the GKE cluster and its CPU pool (the Ray heads' pool)."""

from __future__ import annotations

import re
from typing import Any

from infra.config.gcp_rules import (
    CIDR_RE,
    DEFAULT_GKE_VERSION,
    MIN_GKE_VERSION,
    catalog_free_machine,
    check_zone,
    gke_version_ok,
    zone_region,
)
from infra.config.maintenance import parse_maintenance
from infra.config.reader import Problems, Section, int_range, list_of, name_check, name_valid
from infra.config.schema import (
    NAMESPACE,
    RELEASE_CHANNELS,
    AuthorizedNetwork,
    ClusterConfig,
    CpuPoolConfig,
)


def parse_cluster(
    problems: Problems, raw: Any, region: str | None, slice_zones: tuple[str, ...]
) -> ClusterConfig | None:
    keys = (
        "name",
        "location",
        "releaseChannel",
        "minMasterVersion",
        "privateNodes",
        "masterIpv4CidrBlock",
        "masterAuthorizedNetworks",
        "deletionProtection",
        "network",
        "subnetwork",
        "nodeServiceAccount",
        "cloudNat",
        "cpuPool",
        "maintenance",
    )
    s = Section(problems, f"{NAMESPACE}:cluster", raw if raw is not None else {}, keys)
    name = s.get("name", str, valid=name_valid(40), check=name_check(40))
    location = s.get(
        "location",
        str,
        region,
        valid=f"the region {region} or one of its zones ({region}-a, ...)",
        check=lambda v: v == region or (zone_region(v) == region),
    )
    channel = s.get(
        "releaseChannel",
        str,
        "REGULAR",
        valid=", ".join(RELEASE_CHANNELS),
        check=lambda v: v in RELEASE_CHANNELS,
    )
    version = s.get(
        "minMasterVersion",
        str,
        DEFAULT_GKE_VERSION,
        valid=f"a GKE version >= {MIN_GKE_VERSION} (the Ray Operator add-on needs it)",
        check=gke_version_ok,
    )
    private = s.get("privateNodes", bool, False, valid="true or false")
    cidr = s.get(
        "masterIpv4CidrBlock",
        str,
        "172.16.0.32/28",
        valid="a /28 IPv4 CIDR block, e.g. 172.16.0.32/28",
        check=lambda v: bool(CIDR_RE.match(v)) and v.endswith("/28"),
    )
    networks = []
    for index, item in enumerate(
        list_of(
            problems,
            s.sub("masterAuthorizedNetworks"),
            s.raw.get("masterAuthorizedNetworks"),
            required=False,
        )
    ):
        n = Section(
            problems,
            f"{s.sub('masterAuthorizedNetworks')}[{index}]",
            item,
            ("cidrBlock", "displayName"),
        )
        block = n.get(
            "cidrBlock",
            str,
            valid="an IPv4 CIDR block, e.g. 203.0.113.0/24",
            check=lambda v: bool(CIDR_RE.match(v)),
        )
        display = n.get("displayName", str, "", valid="a string")
        if block:
            networks.append(AuthorizedNetwork(block, display or ""))
    protection = s.get("deletionProtection", bool, True, valid="true or false")
    cloud_nat = s.get(
        "cloudNat",
        bool,
        bool(private),
        valid="true or false",
        hint="private nodes reach Docker Hub (rayproject/ray) only through Cloud NAT",
    )
    network = s.get("network", str, "default", valid="a VPC network name")
    subnetwork = s.get("subnetwork", str, "default", valid="a subnetwork name")
    account = s.get(
        "nodeServiceAccount",
        str,
        None,
        valid="a service account email, e.g. gke-nodes@PROJECT.iam.gserviceaccount.com",
        check=lambda v: "@" in v,
    )
    pool = parse_cpu_pool(problems, s.sub("cpuPool"), s.raw.get("cpuPool", {}), region, slice_zones)
    maintenance = parse_maintenance(problems, s.sub("maintenance"), s.raw.get("maintenance"))
    required = (name, location, channel, version, private, cidr, protection, cloud_nat, pool)
    if None in required or maintenance is None:
        return None
    return ClusterConfig(
        name=name,
        location=location,
        release_channel=channel,
        min_master_version=version,
        private_nodes=private,
        master_ipv4_cidr_block=cidr,
        master_authorized_networks=tuple(networks),
        deletion_protection=protection,
        network=network,
        subnetwork=subnetwork,
        node_service_account=account,
        cloud_nat=cloud_nat,
        cpu_pool=pool,
        maintenance=maintenance,
    )


def parse_cpu_pool(
    problems: Problems, path: str, raw: Any, region: str | None, slice_zones: tuple[str, ...]
) -> CpuPoolConfig | None:
    s = Section(
        problems, path, raw, ("name", "machineType", "minNodes", "maxNodes", "diskSizeGb", "zones")
    )
    name = s.get("name", str, "cpu", valid=name_valid(40), check=name_check(40))
    machine = s.get(
        "machineType",
        str,
        "n2-standard-8",
        valid="a GCE machine type without accelerators, e.g. n2-standard-8",
        check=lambda v: bool(re.match(r"^[a-z0-9]+-[a-z0-9-]+$", v)) and catalog_free_machine(v),
    )
    min_nodes = s.get("minNodes", int, 1, valid="an integer 0..100", check=int_range(0, 100))
    max_nodes = s.get("maxNodes", int, 3, valid="an integer 1..100", check=int_range(1, 100))
    if min_nodes is not None and max_nodes is not None and max_nodes < min_nodes:
        problems.bad(f"{path}.maxNodes", max_nodes, f"an integer >= minNodes ({min_nodes})")
        max_nodes = None
    disk = s.get("diskSizeGb", int, 100, valid="an integer 20..2000", check=int_range(20, 2000))
    zones_raw = s.raw.get("zones")
    zones: tuple[str, ...] = slice_zones
    if zones_raw is not None:
        if not isinstance(zones_raw, list) or not zones_raw:
            problems.bad(f"{path}.zones", zones_raw, f"a non-empty list of zones of {region}")
            zones = ()
        else:
            good = []
            for index, zone in enumerate(zones_raw):
                if check_zone(problems, f"{path}.zones[{index}]", zone, region):
                    good.append(zone)
            zones = tuple(dict.fromkeys(good))
    if not zones and zones_raw is None:
        problems.bad(
            f"{path}.zones",
            None,
            f"a non-empty list of zones of {region}",
            "no slice zone to default to",
        )
    if None in (name, machine, min_nodes, max_nodes, disk):
        return None
    return CpuPoolConfig(name, machine, min_nodes, max_nodes, disk, zones)
