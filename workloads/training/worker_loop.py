"""The training loop of one Ray Train worker (one per TPU host): jax is imported in here only.

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

import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from workloads import storage, telemetry
from workloads.training import goodput as gp
from workloads.training import multislice
from workloads.training.config import TrainConfig, TrainProgress, WorkerPlacement
from workloads.training.faults import FaultPlan

logger = logging.getLogger(__name__)

HANG_EXIT_CODE = 70


def data_index(step: int, skipped: list[int]) -> int:
    """The batch a step trains on: the step's own, shifted past the left-out batches."""
    index = step
    for bad in sorted(skipped):
        if bad <= index:
            index += 1
    return index


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Runs once per TPU host. Must be called under JaxTrainer (jax.distributed is initialized)."""
    if config.get("scale"):  # a preset on a hybrid mesh (workloads.training.multislice)
        return multislice.train_loop_sharded(config, report=_report, placement=_my_placement)
    from functools import partial

    import jax
    import numpy as np
    import ray
    import ray.train as ray_train
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from workloads.data.corpus import load_corpus
    from workloads.model import byte_lm as m
    from workloads.model.checkpoint import open_checkpoints, restore_state, save_state
    from workloads.training import checkpoint_tiers as tiers

    began = time.monotonic()
    _quiet_worker_logs()
    run = TrainConfig.from_dict(config["train"])
    good = run.goodput
    plan = FaultPlan.from_config(config.get("faults", ()))
    skipped: list[int] = list(config.get("skip_data", ()))
    slow_hosts: dict[str, str] = dict(config.get("slow_hosts") or {})
    cfg = m.ModelConfig.from_dict(run.model)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    data_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    me, hosts = jax.process_index(), jax.process_count()
    local_batch = run.global_batch // hosts
    corpus = m.encode(load_corpus())
    board = config["board"]
    placement = _my_placement()
    host_name = f"{placement.slice_name}/{placement.tpu_worker_id}"
    board.placed.remote(placement)
    show_progress = config.get("show_progress", False) and me == 0
    tokens_per_step = run.global_batch * cfg.seq_len
    fast_dir = tiers.fast_root(good.fast_dir) / config.get("run_name", "run")
    phase = {"where": "start"}

    def event(
        kind: str, step: int, host: str, action: str, detail: str = "", wait: bool = False
    ) -> None:
        """Post an event; ``wait``: until the board has it (this host may be gone right after)."""
        posted = board.event.remote(asdict(gp.GoodputEvent(kind, step, host, action, 0.0, detail)))
        if wait:
            ray.get(posted, timeout=10)

    def on_hang(step: int, waited: float, limit: float) -> None:
        path = gp.dump_stacks(Path("raytpu-stacks"), f"{host_name.replace('/', '-')}.txt")
        board.stacks.remote(host_name, path.read_text(encoding="utf-8"))
        culprit = phase["where"] != "collective"
        detail = f"no step for {waited:.1f} s > {limit:.1f} s; this host was in {phase['where']}"
        board.event.remote(
            asdict(
                gp.GoodputEvent("hang", step, host_name if culprit else "", "restart", 0, detail)
            )
        )
        time.sleep(2.0)  # the board calls go out; the peers' watchdogs dump their stacks too
        os._exit(HANG_EXIT_CODE)

    notice_handled = False
    my_node = ray.get_runtime_context().get_node_id()
    # The last durable save's time (0 until one finished: an emergency save is tried).
    durable_s, durable_began = 0.0, None
    watchdog = gp.Watchdog(
        k=good.hang_k, floor_s=good.hang_floor_s, startup_s=good.startup_timeout_s, on_hang=on_hang
    ).start()
    init = jax.jit(partial(m.init_state, cfg), out_shardings=replicated)
    state = init(jax.random.PRNGKey(run.seed))
    step_fn = jax.jit(
        partial(m.train_step, cfg),
        in_shardings=(replicated, data_sharding),
        out_shardings=(replicated, replicated),
    )
    manager = open_checkpoints(run.checkpoint_dir)
    meter = telemetry.TrainTelemetry.from_config(config.get("telemetry"), run, cfg, state.params)

    def restore(at_most: int | None) -> tuple[Any, tiers.RestorePlan, list[float]]:
        """The newest complete checkpoint (<= ``at_most``) of either tier, on every host."""
        mine = [s for s in tiers.fast_steps(fast_dir) if at_most is None or s <= at_most]
        padded = np.full(tiers.FAST_KEEP + 1, -1, np.int64)
        padded[: len(mine[-tiers.FAST_KEEP :])] = mine[-tiers.FAST_KEEP :]
        gathered = np.asarray(multihost_utils.process_allgather(padded)).reshape(hosts, -1)
        fast = [[int(s) for s in row if s >= 0] for row in gathered]
        durable = [s for s in manager.all_steps() if at_most is None or s <= at_most]
        choice = tiers.choose_restore(fast, max(durable, default=None))
        watchdog.expect(good.checkpoint_timeout_s)
        phase["where"] = "restore"
        with meter.checkpoint("restore"):
            if choice.tier == "fast":
                restored, meta = tiers.restore_fast(fast_dir, choice, state, me)
                return restored, choice, list(meta.get("spike_window", ()))
            if choice.tier == "durable":
                return restore_state(manager, choice.step, state), choice, []
        # No checkpoint at or before ``at_most``: from the start (a rollback before the first
        # save must not go on from the parameters it rolls back).
        return init(jax.random.PRNGKey(run.seed)), choice, []

    try:
        phase["where"] = "restore"
        state, choice, history = restore(None)
        resumed_from = choice.step
        board.restored.remote(me, choice.tier, choice.step, host_name)
        spikes = gp.SpikeDetector(good.spike_k, good.spike_window, good.spike_min_history, history)
        slow = gp.SlowHostDetector(
            good.slow_fraction, good.slow_steps, min_excess_s=good.slow_min_excess_s
        )
        losses: list[float] = []
        step = resumed_from
        save_s = 1.0
        while step < run.steps:
            step_began = time.monotonic()
            phase["where"] = "host work"
            local = m.sample_batch(
                corpus, local_batch, cfg.seq_len, seed=(run.seed, data_index(step, skipped), me)
            )
            for fault in plan.at(step, me, hosts):
                plan = plan.without([str(fault)])  # once: a rollback replays the step
                local = plan.apply(
                    fault,
                    fast_dir=fast_dir,
                    batch=local,
                    announce=lambda f: _announce(board, f, host_name),
                    grace_s=good.preempt_grace_s,
                )
            for fault in plan.slow_at(step, me, hosts, host_name, slow_hosts):
                if str(fault) not in slow_hosts:  # it fires: from now on it is this host's
                    _announce(board, fault, host_name)
                    slow_hosts[str(fault)] = host_name
                time.sleep(_slow_delay())
            own_s = time.monotonic() - step_began
            phase["where"] = "collective"
            batch = jax.make_array_from_process_local_data(data_sharding, local)
            new_state, loss = step_fn(state, batch)
            loss_value = float(loss.addressable_data(0))
            host_s = np.asarray(multihost_utils.process_allgather(np.asarray([own_s]))).ravel()
            phase["where"] = "checks"
            seconds = time.monotonic() - step_began
            telemetry.check_loss(step + 1, loss_value)
            if spikes.is_spike(loss_value):
                limit = spikes.threshold() or 0.0
                detail = f"loss {loss_value:.3f} > {limit:.3f} (trend + {good.spike_k} x MAD)"
                if good.spike_policy == "rollback":
                    skipped.append(data_index(step, skipped))
                    board.skip_data.remote(skipped)
                    state, back, history = restore(step)
                    spikes = gp.SpikeDetector(
                        good.spike_k, good.spike_window, good.spike_min_history, history
                    )
                    if me == 0:
                        event("loss_spike", step, "", f"rollback to step {back.step}", detail)
                    step = back.step
                    watchdog.beat(step)
                    continue
                if me == 0:
                    event("loss_spike", step, "", good.spike_policy, detail)
                if good.spike_policy == "skip":
                    new_state = state  # the update of the corrupt batch is dropped
            state = new_state
            losses.append(loss_value)
            done = step + 1
            watchdog.beat(done, seconds)
            if me == 0:  # before a slow-host move ends the attempt: the step counts
                board.step.remote(done, seconds, time.time())
            flagged = slow.observe(seconds, [float(x) for x in host_s])
            moving = good.slow_policy == "restart"
            if moving:  # every host acts on rank 0's view: the move is collective
                flagged = _from_rank0(flagged)
            if flagged is not None:
                detail = (
                    f"step {seconds:.2f} s vs baseline {slow.baseline or 0.0:.2f} s; own time "
                    f"{host_s[flagged]:.2f} s of {' '.join(f'{x:.2f}' for x in host_s)}"
                )
                if moving:
                    phase["where"] = "spare-slice check"
                    watchdog.expect(_spare_check_bound_s())
                if moving and _spare_slice(config["shape"], me):
                    phase["where"] = "checkpoint"
                    watchdog.expect(good.checkpoint_timeout_s)
                    with meter.checkpoint("save"):  # the new slice has no fast tier of ours
                        save_state(manager, done, state, cfg)
                        manager.wait_until_finished()
                    if me == flagged:
                        event("slow_host", done, host_name, gp.MOVE_ACTION, detail, wait=True)
                    multihost_utils.sync_global_devices("raytpu-slow-host-move")
                    raise SlowHostMove(
                        f"host of process {flagged} is slow at step {done}: {detail}"
                    )
                if me == flagged:
                    event(
                        "slow_host", done, host_name, "warned (no spare slice to move to)", detail
                    )
            if show_progress:
                board.post.remote(
                    TrainProgress(done, run.steps, loss_value, tokens_per_step / seconds)
                )
            meter.step(seconds, loss_value)
            if me == 0:
                logger.info("[train] step %d/%d loss %.4f", done, run.steps, loss_value)
            phase["where"] = "checkpoint"
            watchdog.expect(good.checkpoint_timeout_s)
            if good.fast_every and done % good.fast_every == 0:
                saved = time.monotonic()
                tiers.save_fast(fast_dir, done, state, {"spike_window": list(spikes.losses)})
                save_s = time.monotonic() - saved
            if done % run.checkpoint_every == 0 or done == run.steps:
                durable_began = time.monotonic()
                with meter.checkpoint("save"):
                    save_state(manager, done, state, cfg)
            if durable_began is not None and not manager.is_saving_in_progress():
                durable_s, durable_began = time.monotonic() - durable_began, None
            watchdog.beat(done)
            checks = not notice_handled and done % good.preempt_check_every == 0
            notice = ray_train.get_preemption_info() if checks else None
            if notice is not None:
                # A preemption notice: one emergency durable save if it fits, then train on.
                notice_handled = True
                mine = my_node in notice.preempted_node_to_ranks  # the drained host says so
                left = gp.seconds_left(notice.deadline_ms, good.preempt_grace_s, time.time())
                fits = multihost_utils.broadcast_one_to_all(np.asarray(durable_s < left))
                if bool(fits) and mine:  # said first: the host may go before the save ends
                    started = f"emergency durable checkpoint at step {done} started"
                    event("preemption", done, host_name, f"{started}, {left:.1f} s left", wait=True)
                if bool(fits):  # rank 0's decision, on every host: the save is collective
                    saved = time.monotonic()
                    with meter.checkpoint("save"):
                        if done % run.checkpoint_every and done != run.steps:  # not saved yet
                            save_state(manager, done, state, cfg)
                        manager.wait_until_finished()
                    action = (
                        f"emergency durable checkpoint at step {done} "
                        f"({time.monotonic() - saved:.1f} s, {left:.1f} s before the deadline)"
                    )
                else:
                    action = (
                        f"no emergency checkpoint: a durable save took {durable_s:.1f} s, "
                        f"{left:.1f} s left"
                    )
                if mine:
                    event("preemption", done, host_name, action, wait=True)
            if done % run.log_every == 0 and done != run.steps:
                window = losses[-run.log_every :]
                _report({"step": done, "loss": loss_value, "window_losses": window}, final=False)
            step = done
        manager.wait_until_finished()
        watchdog.stop()
        _report(
            {
                "step": max(resumed_from, run.steps),
                "loss": losses[-1] if losses else float("nan"),
                "first_loss": losses[0] if losses else float("nan"),
                "losses": losses,
                "resumed_from": resumed_from,
                "restored_tier": choice.tier,
                "process_count": hosts,
                "device_count": jax.device_count(),
                "local_device_count": jax.local_device_count(),
                "latest_checkpoint": int(manager.latest_step() or 0),
                "params_digest": m.params_digest(state.params),
                "seconds": time.monotonic() - began,
                "fast_save_s": save_s,
            },
            final=True,
        )
    finally:
        watchdog.stop()
        manager.close()


class SlowHostMove(RuntimeError):
    """Raised by every worker to end an attempt whose slow host's slice the driver leaves."""


def _from_rank0(flagged: int | None) -> int | None:
    """Rank 0's flagged host (a collective: every host calls it each step)."""
    import numpy as np
    from jax.experimental import multihost_utils

    value = np.asarray(-1 if flagged is None else flagged, np.int32)
    agreed = int(multihost_utils.broadcast_one_to_all(value))
    return None if agreed < 0 else agreed


def _spare_slice(shape: Any, me: int) -> bool:
    """Whether a whole slice of ``shape`` is free besides the run's (rank 0 tries to reserve one;
    every host gets its answer)."""
    import numpy as np
    from jax.experimental import multihost_utils

    from workloads.slices.reservation import spare_slice_exists

    spare = spare_slice_exists(shape) if me == 0 else False
    return bool(multihost_utils.broadcast_one_to_all(np.asarray(spare)))


def _spare_check_bound_s() -> float:
    """The longest :func:`_spare_slice` takes (with no spare slice, all of it): the hang watchdog
    allows this much around the check."""
    from workloads.slices.release import SETTLE_S
    from workloads.slices.reservation import SPARE_CHECK_TIMEOUT_S

    return SPARE_CHECK_TIMEOUT_S + SETTLE_S + 1.0


def _slow_delay() -> float:
    from workloads.training.faults import SLOW_HOST_DELAY_S

    return SLOW_HOST_DELAY_S


def _announce(board: Any, fault: Any, host: str) -> None:
    """Tell the driver a fault fires (and wait for it: the process may die right after)."""
    import ray

    ray.get(board.fired.remote(str(fault), fault.kind, fault.step, host), timeout=10)


def _my_placement() -> WorkerPlacement:
    import jax
    import ray
    import ray.train

    return WorkerPlacement(
        rank=ray.train.get_context().get_world_rank(),
        node_id=ray.get_runtime_context().get_node_id(),
        slice_name=os.environ.get("TPU_NAME", ""),
        tpu_worker_id=int(os.environ.get("TPU_WORKER_ID", "-1")),
        process_index=jax.process_index(),
    )


def _report(metrics: dict[str, Any], *, final: bool) -> None:
    """``ray.train.report`` every ``log_every`` steps; the final report carries a small Ray Train
    checkpoint (rank 0 only) because Ray Train v2 returns to the driver only metrics attached to
    one."""
    import tempfile

    import ray.train

    if not final:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if ray.train.get_context().get_world_rank() == 0:
            Path(tmp, "summary.json").write_text(json.dumps(metrics), encoding="utf-8")
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=checkpoint)


def _quiet_worker_logs() -> None:
    """Orbax logs every array it writes at INFO through absl; keep warnings only."""
    import absl.logging

    absl.logging.set_verbosity(absl.logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)
    storage.quiet_clients()
