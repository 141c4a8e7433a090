"""TPU slices on GKE: a JobSet manifest that runs launch.train on 1..K slices.

    python -m launch.gke jobset --name bert --topology v5e:16x16 --num_slices 2 \\
        --image IMAGE [--max_restarts 10] [--output bert.yaml] -- \\
        python3 -m launch.train --config configs/bert.py:mlperf_v07 --workdir gs://b/bert
    python -m launch.gke apply ... [--dry_run]      # the same manifest, to `kubectl apply`

The manifest has one replicatedJob per slice (`slice-0` .. `slice-{K-1}`), each an
Indexed Job whose parallelism and completions are the slice's hosts (from the topology:
4 chips per host, 1 host for the single-host slices of up to 8 v5e / v6e chips); its
pods ask for the host's chips (`google.com/tpu`) on nodes with the slice's accelerator
and topology labels (`cloud.google.com/gke-tpu-accelerator`, `.../gke-tpu-topology`),
one slice per node pool. `failurePolicy.maxRestarts` restarts the whole JobSet when a
pod fails (a preempted node, a peer lost, the store unreachable), and the rerun resumes
from the work directory, which must be in a bucket: a restarted pod starts with an empty
disk. A pod that exits with a code no restart can help (1, 2, 70: the supervisors' final
codes) fails its Job through the Job's `podFailurePolicy`, and the JobSet's failure rule
fails the JobSet at once instead of restarting it.

Each pod joins jax.distributed with the project's own variables: MULTIPOD_COORDINATOR
is process 0's pod through the JobSet's headless service
(`NAME-slice-0-0-0.NAME:8476`), MULTIPOD_NUM_PROCESSES the hosts of all slices, and
MULTIPOD_PROCESS_ID the slice's first process plus the pod's completion index
(`JOB_COMPLETION_INDEX`). With several slices the MEGASCALE_* variables give libtpu the
slice count, this pod's slice and its coordinator for the data-centre network. The
command gets `--workdir_wait_s`, so a restarted pod waits for the lease of the pod it
replaces (mlperf/lease.py). The manifest is written as YAML without a YAML library.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import subprocess
import sys
from typing import Any

from absl import app, flags

from launch import launcher_flags as shared
from launch.launcher_flags import value_or
from launch.supervisor import final_failure_codes, workdir_of

COMMANDS = ("jobset", "apply")
COORDINATOR_PORT = 8476
MEGASCALE_PORT = 8080
WORKDIR_WAIT_S = 300
# GKE's node label for the slices of each TPU generation it offers.
ACCELERATORS = {
    "v4": "tpu-v4-podslice",
    "v5e": "tpu-v5-lite-podslice",
    "v5p": "tpu-v5p-slice",
    "v6e": "tpu-v6e-slice",
}


def parse_topology(topology: str) -> tuple[str, tuple[int, ...]]:
    """`v5e:16x16` -> ("v5e", (16, 16)); ValueError naming the accepted forms."""
    match = re.fullmatch(r"([a-z0-9]+):([0-9]+(?:x[0-9]+){1,2})", topology or "")
    if not match or match.group(1) not in ACCELERATORS:
        raise ValueError(
            f"--topology {topology!r}: use <generation>:<AxB[xC]> with a generation GKE "
            f"offers ({', '.join(ACCELERATORS)}), e.g. v5e:16x16 or v4:8x8x8"
        )
    dims = tuple(int(d) for d in match.group(2).split("x"))
    three_d = match.group(1) in ("v4", "v5p")
    if len(dims) != (3 if three_d else 2) or min(dims) < 1:
        shape = "AxBxC" if three_d else "AxB"
        raise ValueError(f"--topology {topology!r}: a {match.group(1)} slice is {shape} chips")
    return match.group(1), dims


def slice_shape(topology: str) -> tuple[int, int]:
    """(hosts, chips per host) of one slice of `topology`."""
    generation, dims = parse_topology(topology)
    chips = math.prod(dims)
    if generation in ("v5e", "v6e") and chips <= 8:
        return 1, chips  # single-host slices: 1, 4 or 8 chips on one VM
    if chips % 4:
        raise ValueError(f"--topology {topology!r}: {chips} chips is not whole hosts of 4")
    return chips // 4, 4


def train_line(words: list[str]) -> str:
    """The launch.train command of every pod, checked for a bucket work directory."""
    if not words:
        raise ValueError("no command given: put it after `--`, e.g. -- python3 -m launch.train")
    workdir = workdir_of(words)
    if not workdir or not workdir.startswith("gs://"):
        raise ValueError(
            f"the JobSet needs the run's --workdir in a bucket (gs://BUCKET/RUN), got "
            f"{workdir or 'none'}: a restarted pod starts with an empty disk and resumes "
            "from its work directory."
        )
    line = words[0] if len(words) == 1 else shlex.join(words)
    if "--workdir_wait_s" not in line:
        line += f" --workdir_wait_s={WORKDIR_WAIT_S}"
    return line


def jobset(
    name: str,
    topology: str,
    num_slices: int,
    image: str,
    words: list[str],
    max_restarts: int = 10,
    namespace: str | None = None,
) -> dict[str, Any]:
    """The JobSet manifest (a plain dict; see the module docstring)."""
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", name or ""):
        raise ValueError(
            f"--name {name!r}: use lower-case letters, digits and '-' (a DNS label of at "
            "most 40 characters: the pods' host names are built from it)"
        )
    if not image:
        raise ValueError("--image is required: a container image with the project installed")
    if num_slices < 1:
        raise ValueError(f"--num_slices={num_slices}: must be >= 1")
    if max_restarts < 0:
        raise ValueError(f"--max_restarts={max_restarts}: must be >= 0")
    generation, dims = parse_topology(topology)
    hosts, chips = slice_shape(topology)
    line = train_line(words)
    coordinator_host = f"{name}-slice-0-0-0.{name}"
    metadata: dict[str, Any] = {
        "name": name,
        "annotations": {
            "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
        },
    }
    if namespace:
        metadata["namespace"] = namespace
    jobs = []
    for s in range(num_slices):
        env = [
            {"name": "MULTIPOD_COORDINATOR", "value": f"{coordinator_host}:{COORDINATOR_PORT}"},
            {"name": "MULTIPOD_NUM_PROCESSES", "value": str(hosts * num_slices)},
        ]
        ports = [COORDINATOR_PORT]
        if num_slices > 1:
            ports.append(MEGASCALE_PORT)
            env += [
                {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": coordinator_host},
                {"name": "MEGASCALE_NUM_SLICES", "value": str(num_slices)},
                {"name": "MEGASCALE_SLICE_ID", "value": str(s)},
                {"name": "MEGASCALE_PORT", "value": str(MEGASCALE_PORT)},
            ]
        # The process id is the slice's first process plus the pod's completion index,
        # which Kubernetes sets in each pod of an Indexed Job.
        first = s * hosts
        script = f"export MULTIPOD_PROCESS_ID=$(( {first} + JOB_COMPLETION_INDEX )) && exec {line}"
        container = {
            "name": "train",
            "image": image,
            "command": ["bash", "-c", script],
            "env": env,
            "ports": [{"containerPort": p} for p in ports],
            "resources": {"limits": {"google.com/tpu": chips}},
        }
        pod = {
            "restartPolicy": "Never",
            "nodeSelector": {
                "cloud.google.com/gke-tpu-accelerator": ACCELERATORS[generation],
                "cloud.google.com/gke-tpu-topology": "x".join(map(str, dims)),
            },
            "containers": [container],
        }
        job = {
            "parallelism": hosts,
            "completions": hosts,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            # A pod that ends with a code no restart can help fails its Job with reason
            # PodFailurePolicy, which the JobSet's rule below does not restart.
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "train",
                            "operator": "In",
                            "values": final_failure_codes(),
                        },
                    }
                ]
            },
            "template": {"spec": pod},
        }
        jobs.append({"name": f"slice-{s}", "replicas": 1, "template": {"spec": job}})
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": metadata,
        "spec": {
            "failurePolicy": {
                "maxRestarts": max_restarts,
                "rules": [
                    {
                        "name": "no-restart-for-final-exit-codes",
                        "action": "FailJobSet",
                        "onJobFailureReasons": ["PodFailurePolicy"],
                    }
                ],
            },
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": jobs,
        },
    }


_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _RESERVED:
        return text
    return json.dumps(text)  # a double-quoted YAML string


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML of dicts, lists and scalars (strings quoted when needed)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{_scalar(key)}:")
                lines.append(to_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{_scalar(key)}: {_inline(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                body = to_yaml(item, indent + 2).split("\n")
                lines.append(f"{pad}- {body[0].lstrip()}")
                lines.extend(body[1:])
            elif isinstance(item, list) and item:
                lines.append(f"{pad}-")
                lines.append(to_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}- {_inline(item)}")
    else:
        lines.append(pad + _scalar(value))
    return "\n".join(lines)


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


_TOPOLOGY = flags.DEFINE_string("topology", None, "One slice, e.g. v5e:16x16 or v4:8x8x8.")
_IMAGE = flags.DEFINE_string("image", None, "Container image with the project installed.")
_NAMESPACE = flags.DEFINE_string("namespace", None, "Kubernetes namespace (default: kubectl's).")
_OUTPUT = flags.DEFINE_string("output", None, "jobset: write the manifest here (default: print).")


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in COMMANDS:
        got = repr(argv[1]) if len(argv) > 1 else "none"
        raise app.UsageError(f"give a command, one of {', '.join(COMMANDS)} (got {got})")
    words = argv[2:]
    try:
        if not _TOPOLOGY.value:
            raise ValueError("--topology is required, e.g. v5e:16x16 or v4:8x8x8")
        manifest = jobset(
            shared.NAME.value,
            _TOPOLOGY.value,
            shared.NUM_SLICES.value,
            _IMAGE.value,
            words,
            value_or(shared.MAX_RESTARTS, 10),
            _NAMESPACE.value,
        )
    except ValueError as e:
        print(f"multipod: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    text = to_yaml(manifest) + "\n"
    if argv[1] == "jobset" or shared.DRY_RUN.value:
        if argv[1] == "jobset" and _OUTPUT.value:
            with open(_OUTPUT.value, "w") as f:
                f.write(text)
            print(f"wrote {_OUTPUT.value}", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print(
            "multipod: error: kubectl not found; install it and point it at the GKE cluster, "
            "or write the manifest with `launch.gke jobset` (or `apply --dry_run`).",
            file=sys.stderr,
        )
        raise SystemExit(2)
    print(f"+ {kubectl} apply -f -", file=sys.stderr, flush=True)
    code = subprocess.run([kubectl, "apply", "-f", "-"], input=text, text=True).returncode
    raise SystemExit(code)


if __name__ == "__main__":
    app.run(main)
