"""The cloud section of a run config: the fleet a run is launched onto and priced with, its
checkpoint store, budget and deadline. `cloud/` owns it (the cost meter, the launcher and the
stores read it); `spotlight.config.RunConfig` composes it as `cloud:`. Values are checked here
(`schedulers.input.config_section`: types and ranges on the fields, the names and the store URI below),
each error one line naming the field (the run config's loader prefixes the file and `cloud.`).
"""

from __future__ import annotations

from dataclasses import field
from typing import Literal

from pydantic import StrictFloat, StrictInt, StrictStr

from cloud.names import image_problem, region_problem
from cloud.store import StoreURIError, parse_store_uri
from schedulers.input.config_section import limited, section
from schedulers.input.files import ConfigError, check


@section
class CloudConfig:
    """The fleet a run is launched onto and priced with: `spotlight launch` turns it into SkyPilot
    tasks (an on-demand head, spot worker pools), and the cost meter prices its instance-seconds.
    Nothing here changes what a run computes, so a resume may change any of it."""

    gpu: StrictStr = "H100"
    """Accelerator of the head (learner) and the workers' first choice, as SkyPilot and the price
    table name it (e.g. H100, A100-80GB, L4)."""
    gpus_per_node: StrictInt = limited(1, gt=0, le=64, unit=" GPUs")
    """Accelerators per node (head and workers), 1..64; a node is one instance of the price table."""
    fallback_gpus: list[StrictStr] = field(default_factory=list)
    """Further accelerators a spot worker pool may take when `gpu` has no spot capacity."""
    accelerator_order: Literal["any_of", "ordered"] = "any_of"
    """How SkyPilot picks among `gpu` + `fallback_gpus`: the cheapest available (`any_of`) or the
    first available in this order (`ordered`)."""
    instance_type: StrictStr | None = None
    """Price-table row the meter uses for every node; None: the cheapest row with `gpu` x `gpus_per_node`."""
    provider: Literal["aws", "gcp"] | None = None
    """Cloud to launch on; None lets SkyPilot choose among those enabled."""
    region: StrictStr | None = None
    """Region of every node, as the cloud names it (us-east-1 on AWS, us-central1 on GCP; of
    `provider` when one is named); None lets SkyPilot choose."""
    job_recovery: Literal["FAILOVER", "EAGER_NEXT_REGION"] = "FAILOVER"
    """SkyPilot's recovery strategy for a preempted node (each spot node is a task of its own in
    the run's job group). Either way a recovered node stays in the region the group was placed in:
    SkyPilot 0.14.1 pins every task of a job group to the cloud and region its optimizer chose
    (`sky/jobs/server/core.py`, near line 933), and EAGER_NEXT_REGION blocks the region it lost only
    for a task that names none (`EagerFailoverStrategy.recover` in `sky/jobs/recovery_strategy.py`).
    So FAILOVER and EAGER_NEXT_REGION both retry in that region (another zone may serve)."""
    image_id: StrictStr | None = None
    """Node image of every node (SkyPilot's `image_id`): `docker:IMAGE` (a Docker reference), an AWS
    AMI `ami-...`, a GCP image `projects/P/global/images/NAME` or a SkyPilot tag `skypilot:NAME`
    (the grammars: `cloud.names`). One built by running the node setup once (`cloud/node_setup.py`:
    ~/.spotlight-venv and ~/.spotlight-fleet.lock in the image) skips the install in each node's
    setup (docs/launching.md); None: the cloud's default image, installed at setup."""
    max_restarts_on_errors: StrictInt = limited(3, ge=0, le=1000)
    """SkyPilot restarts of a node whose task failed by itself (not preempted), 0..1,000."""
    checkpoint_uri: StrictStr | None = None
    """Where checkpoints and committed in-flight state live besides the run folder: s3://bucket/prefix
    (honours $AWS_ENDPOINT_URL), gs://bucket/prefix (Google Cloud Storage, `cloud.gcs`) or
    file:///path — a folder only inside $SPOTLIGHT_STORE_ROOTS (else the working directory), see
    `cloud.store`; None: the run folder only."""
    inflight_every_s: StrictFloat = limited(30.0, ge=0, le=86400, unit=" s")
    """With a checkpoint_uri: seconds between snapshots of a running rollout's committed state (finished
    results, partial states) in the store, which a restarted controller resumes the iteration from
    (`spotlight.train.inflight`); 0..86,400, 0: none."""
    budget_usd: StrictFloat | None = limited(None, gt=0, le=1e9, unit=" dollars")
    """Stop cleanly (final checkpoint, summary says why) before the metered cost would exceed this;
    in (0, 1e9] dollars."""
    deadline_h: StrictFloat | None = limited(None, gt=0, le=87600, unit=" hours")
    """Hours from the start the run must finish in, in (0, 87,600] (ten years): spot workers fall
    back to on-demand when the run falls behind uniform progress toward it."""
    prices: StrictStr | None = None
    """Price table CSV; None: the shipped table (cloud/prices.csv)."""
    price_scale: StrictFloat = limited(1.0, gt=0, le=1e6)
    """Multiplies every price (tests scale prices so a budget binds on a tiny CPU run); in (0, 1e6]."""

    def __post_init__(self) -> None:
        # SkyPilot puts both unquoted into the cluster templates, and a Docker image into `docker pull`
        # on every node (cloud/names.py says where): each must be a name of its grammar, for the cloud
        # named, not merely free of spaces (issue 27: `docker:img;touch${IFS}/tmp/x` passed that).
        if self.region is not None:
            expected = region_problem(self.region, self.provider)
            check(expected is None, "region", f"{expected} or null", self.region)
        if self.image_id is not None:
            expected = image_problem(self.image_id, self.provider)
            check(expected is None, "image_id", f"{expected} or null", self.image_id)
        if self.checkpoint_uri is not None:
            try:
                parse_store_uri(self.checkpoint_uri)
            except StoreURIError as err:
                raise ConfigError(f"checkpoint_uri: {err}") from None
