"""The training loop of one Ray Train worker (one per TPU host), :class:`WorkerLoop`, for every
model family (:mod:`workloads.model.family`: the byte LM and the presets): jax is imported in
here only.

Per step: the host's own work (its data, injected faults) is timed, the step runs on the mesh,
and then the goodput checks run on every host alike (their inputs are global: the loss, and
every host's own time gathered by a collective), so every host takes the same decision:

- loss spike (:class:`workloads.training.goodput.SpikeDetector`): ``log``; ``skip`` (the step's update is
  dropped, its batch is not trained on); ``rollback`` (back to the newest checkpoint of either
  tier, the offending batch left out from then on);
- slow host (:class:`workloads.training.goodput.SlowHostDetector`): named in an event (policy ``warn``);
  policy ``restart``: every host acts on rank 0's detector; when a spare slice is free, an
  emergency durable checkpoint, the event, and every worker raises :class:`SlowHostMove` (the
  driver holds the slow slice and restarts on another);
- hang (:class:`workloads.training.goodput.Watchdog`): stacks dumped, the worker ends, the driver restarts;
- fast tier every ``goodput.fast_every`` steps, durable tier every ``checkpoint_every``
  (:mod:`workloads.training.checkpoint_tiers`);
- preemption notice (``ray.train.get_preemption_info``: Ray Train's watcher saw a node of the run
  drained for preemption, as ``ray start`` does on SIGTERM): an emergency checkpoint to the
  durable tier, once, if the last durable save's time fits before the deadline; training goes
  on until the host goes away, and the restarted attempt resumes from that checkpoint.

Events go to the run's board (:class:`workloads.training.config.RunBoard`), which the driver reads.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from workloads import telemetry
from workloads.training import goodput as gp
from workloads.training import multislice
from workloads.training import worker_io as io
from workloads.training.config import TrainConfig, TrainProgress
from workloads.training.faults import SLOW_HOST_DELAY_S, FaultPlan, FaultSpec

logger = logging.getLogger(__name__)

HANG_EXIT_CODE = 70


def data_index(step: int, skipped: list[int]) -> int:
    """The batch a step trains on: the step's own, shifted past the left-out batches."""
    index = step
    for bad in sorted(skipped):
        if bad <= index:
            index += 1
    return index


class SlowHostMove(RuntimeError):
    """Raised by every worker to end an attempt whose slow host's slice the driver leaves."""


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """JaxTrainer's ``train_loop_per_worker``: runs once per TPU host, under JaxTrainer
    (``jax.distributed`` is initialized), the byte LM or a preset alike."""
    WorkerLoop(config).run()


class WorkerLoop:
    """One worker's training run, any :class:`workloads.model.family.ModelFamily`: setup (the
    family's mesh, jitted init and step, data, watchdog, checkpoints), restore (either tier),
    step (host work, the step on the mesh, loss-spike and slow-host checks), checkpoint (fast
    and durable tiers, a preemption's emergency save) and hang (the watchdog's end)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.began = time.monotonic()
        self.config = config
        self.where = "start"
        """What this host is doing, for a hang's report: ``collective`` blames a peer."""
        self.setup()

    # ------------------------------------------------------------------------------ setup
    def setup(self) -> None:
        """Read the run's config, place this host, start the watchdog, compile and init."""
        import jax
        import ray

        from workloads.model import compile_cache
        from workloads.model.checkpoint import open_checkpoints
        from workloads.model.family import family_for
        from workloads.training import checkpoint_tiers as tiers

        io.quiet_worker_logs()
        compile_cache.from_env()  # before the first jit: a restart loads its compilations
        config = self.config
        self.run_cfg = run = TrainConfig.from_dict(config["train"])
        self.good = run.goodput
        self.plan = FaultPlan.from_config(config.get("faults", ()))
        self.skipped: list[int] = list(config.get("skip_data", ()))
        self.slow_hosts: dict[str, str] = dict(config.get("slow_hosts") or {})
        self.family = config.get("family") or family_for(
            multislice.family_spec(run.model, config.get("scale"))
        )
        self.me, self.hosts = jax.process_index(), jax.process_count()
        self.board = config["board"]
        placement = io.my_placement()
        self.host_name = f"{placement.slice_name}/{placement.tpu_worker_id}"
        self.board.placed.remote(placement)
        self.megascale = multislice.worker_env(config.get("scale"), self.me)
        self.mesh = self.family.mesh(jax.devices())
        self.local_batch = run.global_batch // self.hosts
        self.data = self.family.batches(run.seed, self.me, self.hosts)
        self.show_progress = config.get("show_progress", False) and self.me == 0
        self.tokens_per_step = run.global_batch * self.family.config.seq_len
        self.fast_dir = tiers.fast_root(self.good.fast_dir) / config.get("run_name", "run")
        self.my_node = ray.get_runtime_context().get_node_id()
        self.notice_handled = False
        self.durable_s, self.durable_began = 0.0, None
        """The last durable save's time (0 until one finished: an emergency save is tried)."""
        self.save_s = 1.0
        self.losses: list[float] = []
        self.watchdog = gp.Watchdog(
            k=self.good.hang_k,
            floor_s=self.good.hang_floor_s,
            startup_s=self.good.startup_timeout_s,
            on_hang=self.on_hang,
        ).start()
        self.compile()
        self.state = self.init_fn(jax.random.PRNGKey(run.seed))  # restore's shapes, shardings
        self.manager = open_checkpoints(run.checkpoint_dir)
        self.meter = telemetry.TrainTelemetry.from_config(
            config.get("telemetry"),
            run,
            self.family.config,
            self.state.params,
            flops_per_token=self.family.flops_per_token,
        )

    def compile(self) -> None:
        """The family's init and train step jitted with its shardings on the mesh."""
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        self.state_shardings = state = self.family.state_shardings(self.mesh)
        self.batch_sharding = self.family.batch_sharding(self.mesh)
        replicated = NamedSharding(self.mesh, P())
        self.init_fn = jax.jit(self.family.init, out_shardings=state)
        self.step_fn = jax.jit(
            self.family.train_step,
            in_shardings=(state, self.batch_sharding),
            out_shardings=(state, replicated),
        )

    def init(self) -> Any:
        """The state of a run with no checkpoint yet: the family's init or, for a preset with
        ``scale.init_from``, the Hugging Face folder's weights (each host reading only its
        shards) and a new optimizer state."""
        import jax

        folder = (self.config.get("scale") or {}).get("init_from")
        if not folder:
            return self.init_fn(jax.random.PRNGKey(self.run_cfg.seed))
        from workloads.model import hf_llama

        shardings = self.state_shardings
        params = hf_llama.load_params(folder, self.family.preset, shardings.params)
        return jax.jit(self.family.state_from, out_shardings=shardings)(params)

    # ------------------------------------------------------------------------------ restore
    def restore(self, at_most: int | None) -> tuple[Any, Any, list[float]]:
        """The newest complete checkpoint (<= ``at_most``) of either tier, on every host:
        (state, the restore plan, the spike detector's saved window)."""
        import numpy as np
        from jax.experimental import multihost_utils

        from workloads.model.checkpoint import restore_state
        from workloads.training import checkpoint_tiers as tiers

        keep = tiers.FAST_KEEP
        mine = [s for s in tiers.fast_steps(self.fast_dir) if at_most is None or s <= at_most]
        padded = np.full(keep + 1, -1, np.int64)
        padded[: len(mine[-keep:])] = mine[-keep:]
        gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(self.hosts, -1)
        fast = [[int(s) for s in row if s >= 0] for row in gathered]
        durable = [s for s in self.manager.all_steps() if at_most is None or s <= at_most]
        choice = tiers.choose_restore(fast, max(durable, default=None))
        self.watchdog.expect(self.good.checkpoint_timeout_s)
        self.where = "restore"
        with self.meter.checkpoint("restore"):
            if choice.tier == "fast":
                restored, meta = tiers.restore_fast(self.fast_dir, choice, self.state, self.me)
                return restored, choice, list(meta.get("spike_window", ()))
            if choice.tier == "durable":  # Orbax reshards onto this mesh (1 slice -> 2)
                return restore_state(self.manager, choice.step, self.state), choice, []
        # No checkpoint at or before ``at_most``: from the start (a rollback before the first
        # save must not go on from the parameters it rolls back).
        return self.init(), choice, []

    def spike_detector(self, history: list[float]) -> gp.SpikeDetector:
        good = self.good
        return gp.SpikeDetector(good.spike_k, good.spike_window, good.spike_min_history, history)

    # ------------------------------------------------------------------------------ run
    def run(self) -> None:
        """Restore, train to ``steps``, and send the final report."""
        try:
            self.where = "restore"
            self.state, choice, history = self.restore(None)
            self.resumed_from, self.restored_tier = choice.step, choice.tier
            self.board.restored.remote(self.me, choice.tier, choice.step, self.host_name)
            self.spikes = self.spike_detector(history)
            good = self.good
            self.slow = gp.SlowHostDetector(
                good.slow_fraction, good.slow_steps, min_excess_s=good.slow_min_excess_s
            )
            step = self.resumed_from
            while step < self.run_cfg.steps:
                step = self.step(step)
            # The last durable save may still be uploading: a checkpoint's bound, not a step's.
            self.where = "checkpoint"
            self.watchdog.expect(self.good.checkpoint_timeout_s)
            self.manager.wait_until_finished()
            self.watchdog.stop()
            io.report(self.summary(), final=True)
        finally:
            self.watchdog.stop()
            self.manager.close()

    # ------------------------------------------------------------------------------ step
    def step(self, step: int) -> int:
        """Train ``step``; the next step to run (after a rollback: the restored one)."""
        import jax
        import numpy as np
        from jax.experimental import multihost_utils

        began = time.monotonic()
        local = self.host_work(step)
        own_s = time.monotonic() - began
        self.where = "collective"
        batch = jax.make_array_from_process_local_data(self.batch_sharding, local)
        new_state, loss = self.step_fn(self.state, batch)
        loss_value = float(loss.addressable_data(0))
        host_s = np.asarray(multihost_utils.process_allgather(np.asarray([own_s]))).ravel()
        self.where = "checks"
        seconds = time.monotonic() - began
        telemetry.check_loss(step + 1, loss_value)
        if self.spikes.is_spike(loss_value):
            if self.good.spike_policy == "rollback":
                return self.rollback(step, loss_value)
            self.spike_event(step, loss_value, self.good.spike_policy)
            if self.good.spike_policy == "skip":
                new_state = self.state  # the update of the corrupt batch is dropped
        self.state = new_state
        self.losses.append(loss_value)
        done = step + 1
        self.watchdog.beat(done, seconds)
        if self.me == 0:  # before a slow-host move ends the attempt: the step counts
            self.board.step.remote(done, seconds, time.time())
        self.slow_host(done, seconds, [float(x) for x in host_s])
        self.progress(done, seconds, loss_value)
        self.checkpoint(done)
        self.preemption(done)
        log_every = self.run_cfg.log_every
        if done % log_every == 0 and done != self.run_cfg.steps:
            window = self.losses[-log_every:]
            io.report({"step": done, "loss": loss_value, "window_losses": window}, final=False)
        return done

    def host_work(self, step: int) -> Any:
        """This host's own part of a step: its batch, and the faults injected here."""
        self.where = "host work"
        local = self.data.batch(data_index(step, self.skipped), self.local_batch)
        for fault in self.plan.at(step, self.me, self.hosts):
            self.plan = self.plan.without([str(fault)])  # once: a rollback replays the step
            local = self.plan.apply(
                fault,
                fast_dir=self.fast_dir,
                batch=local,
                announce=self.announce,
                grace_s=self.good.preempt_grace_s,
            )
        for fault in self.plan.slow_at(step, self.me, self.hosts, self.host_name, self.slow_hosts):
            if str(fault) not in self.slow_hosts:  # it fires: from now on it is this host's
                self.announce(fault)
                self.slow_hosts[str(fault)] = self.host_name
            time.sleep(SLOW_HOST_DELAY_S)
        return local

    def announce(self, fault: FaultSpec) -> None:
        io.announce(self.board, fault, self.host_name)

    def event(
        self, kind: str, step: int, host: str, action: str, detail: str = "", wait: bool = False
    ) -> None:
        io.post_event(self.board, kind, step, host, action, detail, wait)

    def spike_detail(self, loss_value: float) -> str:
        limit = self.spikes.threshold() or 0.0
        return f"loss {loss_value:.3f} > {limit:.3f} (trend + {self.good.spike_k} x MAD)"

    def spike_event(self, step: int, loss_value: float, action: str) -> None:
        if self.me == 0:
            self.event("loss_spike", step, "", action, self.spike_detail(loss_value))

    def rollback(self, step: int, loss_value: float) -> int:
        """Back to the newest checkpoint of either tier, this step's batch left out from now on."""
        detail = self.spike_detail(loss_value)
        self.skipped.append(data_index(step, self.skipped))
        self.board.skip_data.remote(self.skipped)
        self.state, back, history = self.restore(step)
        self.spikes = self.spike_detector(history)
        if self.me == 0:
            self.event("loss_spike", step, "", f"rollback to step {back.step}", detail)
        self.watchdog.beat(back.step)
        return back.step

    def slow_host(self, done: int, seconds: float, host_s: list[float]) -> None:
        """Name a slow host; policy ``restart`` with a spare slice: save, then every worker
        raises :class:`SlowHostMove` (the driver holds the slow slice and restarts)."""
        flagged = self.slow.observe(seconds, host_s)
        moving = self.good.slow_policy == "restart"
        if moving:  # every host acts on rank 0's view: the move is collective
            flagged = io.from_rank0(flagged)
        if flagged is None:
            return
        detail = (
            f"step {seconds:.2f} s vs baseline {self.slow.baseline or 0.0:.2f} s; own time "
            f"{host_s[flagged]:.2f} s of {' '.join(f'{x:.2f}' for x in host_s)}"
        )
        if moving:
            self.where = "spare-slice check"
            self.watchdog.expect(io.spare_check_bound_s())
        if moving and io.spare_slice(self.config["shape"], self.me):
            self.move_off(done, flagged, detail)
        if self.me == flagged:
            self.event(
                "slow_host", done, self.host_name, "warned (no spare slice to move to)", detail
            )

    def move_off(self, done: int, flagged: int, detail: str) -> None:
        """A durable checkpoint (the new slice has no fast tier of ours), then the move."""
        from jax.experimental import multihost_utils

        self.where = "checkpoint"
        self.watchdog.expect(self.good.checkpoint_timeout_s)
        self.save_durable(done, wait=True)
        if self.me == flagged:
            self.event("slow_host", done, self.host_name, gp.MOVE_ACTION, detail, wait=True)
        multihost_utils.sync_global_devices("raytpu-slow-host-move")
        raise SlowHostMove(f"host of process {flagged} is slow at step {done}: {detail}")

    def progress(self, done: int, seconds: float, loss_value: float) -> None:
        if self.show_progress:
            rate = self.tokens_per_step / seconds
            self.board.post.remote(TrainProgress(done, self.run_cfg.steps, loss_value, rate))
        self.meter.step(seconds, loss_value)
        if self.me == 0:
            logger.info("[train] step %d/%d loss %.4f", done, self.run_cfg.steps, loss_value)

    # ------------------------------------------------------------------------------ checkpoint
    def checkpoint(self, done: int) -> None:
        """The fast tier every ``fast_every`` steps, the durable one every ``checkpoint_every``
        and at the end; the last durable save's time, once it finished."""
        from workloads.training import checkpoint_tiers as tiers

        self.where = "checkpoint"
        self.watchdog.expect(self.good.checkpoint_timeout_s)
        fast_every = self.good.fast_every
        if fast_every and done % fast_every == 0:
            saved = time.monotonic()
            meta = {"spike_window": list(self.spikes.losses)}
            tiers.save_fast(self.fast_dir, done, self.state, meta)
            self.save_s = time.monotonic() - saved
        if self.durable_due(done):
            self.durable_began = time.monotonic()
            self.save_durable(done)
        if self.durable_began is not None and not self.manager.is_saving_in_progress():
            self.durable_s, self.durable_began = time.monotonic() - self.durable_began, None
        self.watchdog.beat(done)

    def durable_due(self, done: int) -> bool:
        return done % self.run_cfg.checkpoint_every == 0 or done == self.run_cfg.steps

    def save_durable(self, done: int, *, wait: bool = False) -> None:
        from workloads.model.checkpoint import save_state

        with self.meter.checkpoint("save"):
            save_state(self.manager, done, self.state, self.family)
            if wait:
                self.manager.wait_until_finished()

    def preemption(self, done: int) -> None:
        """On Ray Train's preemption notice: one emergency durable save if it fits before the
        deadline (rank 0's decision, on every host: the save is collective), then train on."""
        import numpy as np
        import ray.train as ray_train
        from jax.experimental import multihost_utils

        from workloads.model.checkpoint import save_state

        checks = not self.notice_handled and done % self.good.preempt_check_every == 0
        notice = ray_train.get_preemption_info() if checks else None
        if notice is None:
            return
        self.notice_handled = True
        mine = self.my_node in notice.preempted_node_to_ranks  # the drained host says so
        left = gp.seconds_left(notice.deadline_ms, self.good.preempt_grace_s, time.time())
        fits = bool(multihost_utils.broadcast_one_to_all(np.asarray(self.durable_s < left)))
        if fits and mine:  # said first: the host may go before the save ends
            started = f"emergency durable checkpoint at step {done} started"
            self.event(
                "preemption", done, self.host_name, f"{started}, {left:.1f} s left", wait=True
            )
        if fits:
            saved = time.monotonic()
            with self.meter.checkpoint("save"):
                if not self.durable_due(done):  # not saved yet
                    save_state(self.manager, done, self.state, self.family)
                self.manager.wait_until_finished()
            action = (
                f"emergency durable checkpoint at step {done} "
                f"({time.monotonic() - saved:.1f} s, {left:.1f} s before the deadline)"
            )
        else:
            action = (
                f"no emergency checkpoint: a durable save took {self.durable_s:.1f} s, "
                f"{left:.1f} s left"
            )
        if mine:
            self.event("preemption", done, self.host_name, action, wait=True)

    # ------------------------------------------------------------------------------ hang
    def on_hang(self, step: int, waited: float, limit: float) -> None:
        """The watchdog's end: stacks to the board, the event (naming this host unless it
        waited in a collective), and the process exits (the driver restarts the run)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        path = gp.dump_stacks(Path("raytpu-stacks"), f"{self.host_name.replace('/', '-')}.txt")
        stacks = self.board.stacks.remote(self.host_name, path.read_text(encoding="utf-8"))
        culprit = self.where != "collective"
        detail = f"no step for {waited:.1f} s > {limit:.1f} s; this host was in {self.where}"
        try:  # on the board before the process goes (else the driver reads a silent host loss)
            self.event("hang", step, self.host_name if culprit else "", "restart", detail, True)
            ray.get(stacks, timeout=10)
        except (GetTimeoutError, RayActorError) as error:
            logger.warning("hang: the board did not take the event: %s", error)
        time.sleep(2.0)  # the peers' watchdogs dump their stacks too
        os._exit(HANG_EXIT_CODE)

    # ------------------------------------------------------------------------------ report
    def summary(self) -> dict[str, Any]:
        """The final report's metrics (a collective for sharded parameters: every host)."""
        import jax

        from workloads.model.byte_lm import params_digest

        losses, steps = self.losses, self.run_cfg.steps
        summary = {
            "step": max(self.resumed_from, steps),
            "loss": losses[-1] if losses else float("nan"),
            "first_loss": losses[0] if losses else float("nan"),
            "losses": losses,
            "resumed_from": self.resumed_from,
            "restored_tier": self.restored_tier,
            "process_count": self.hosts,
            "device_count": jax.device_count(),
            "local_device_count": jax.local_device_count(),
            "latest_checkpoint": int(self.manager.latest_step() or 0),
            "params_digest": params_digest(self.state.params),
            "seconds": time.monotonic() - self.began,
            "fast_save_s": self.save_s,
        }
        if self.config.get("scale"):
            summary["scale"] = multislice.scale_report(
                self.family, self.mesh, self.megascale, self.state, self.data
            )
        return summary
