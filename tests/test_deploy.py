"""The Kubernetes files under deploy/ keep the fields that make a kernel pod a sandbox.

The template is rendered as Enterprise Gateway's launcher renders it (Jinja, lower-case KERNEL_*
variables), including with hostile client variables, and the result parsed as YAML.
"""

from __future__ import annotations

import re
from typing import Any, cast

import yaml
from deploy_support import DEPLOY, dockerfile_user, render_pod

# What a client could send as KERNEL_UID, KERNEL_CPUS_LIMIT, KERNEL_VOLUMES, ... to weaken the stock template.
HOSTILE = {"kernel_uid": 0, "kernel_gid": 0, "kernel_cpus_limit": 64, "kernel_volumes": ["{hostPath: {path: /}}"]}


def test_the_kernel_pod_runs_as_non_root_on_a_read_only_root_with_no_token_and_fixed_limits() -> None:
    pod = render_pod({})
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    [container] = spec["containers"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"] and not security["privileged"]
    assert {"cpu", "memory", "ephemeral-storage"} <= set(container["resources"]["limits"])
    # The only writable place is a size-capped volume at /tmp.
    [mount] = container["volumeMounts"]
    [volume] = spec["volumes"]
    assert mount == {"name": volume["name"], "mountPath": "/tmp"} and volume["emptyDir"]["sizeLimit"]
    assert pod["metadata"]["labels"]["ipybox/role"] == "kernel"


def test_client_variables_cannot_change_the_pods_user_resources_or_volumes() -> None:
    assert render_pod(HOSTILE) == render_pod({})


def test_the_network_policy_allows_kernel_pods_no_egress_but_the_gateways_response_port() -> None:
    policy = cast("dict[str, Any]", yaml.safe_load((DEPLOY / "kubernetes" / "kernel-networkpolicy.yaml").read_text()))
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= render_pod({})["metadata"]["labels"].items()
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    [egress] = spec["egress"]
    assert egress["ports"] == [{"protocol": "TCP", "port": 8877}]
    assert all("ipBlock" not in peer for peer in egress["to"])
    assert all(peer["podSelector"]["matchLabels"]["app"] == "enterprise-gateway" for peer in egress["to"])


def test_the_kernel_image_installs_ipybox_and_runs_as_a_non_root_user() -> None:
    dockerfile = (DEPLOY / "kernel-image" / "Dockerfile").read_text()
    assert re.search(r'pip install [^\n]*"ipybox==\$\{IPYBOX_VERSION\}"', dockerfile)
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")


def test_the_kernel_image_and_the_pod_run_the_kernel_as_the_same_user_and_group() -> None:
    # The pod's runAsUser/runAsGroup override the image's USER; the two disagreeing would mean one
    # of the files was changed without the other.
    security = render_pod({})["spec"]["securityContext"]
    assert dockerfile_user() == (security["runAsUser"], security["runAsGroup"])
