"""The train loop's hooks: cadence, order, stopping, and the standard hooks' order."""

from types import SimpleNamespace

from mlperf.loop import standard_hooks
from mlperf.loop_hooks import Hooks, StepEnd, every


def step_end(step: int, **due) -> StepEnd:
    flags = dict(last=False, boundary=False, save=False, preempted=False) | due
    return StepEnd(step, "state", "metrics", "key", 0, "pr", **flags)


def test_a_hook_every_n_steps_fires_at_multiples_of_n():
    fired = []
    hooks = Hooks()
    hooks.add("every3", lambda at: fired.append(at.step) or True, due=every(3))
    hooks.add("never", lambda at: fired.append(-at.step) or True, due=every(0))
    for step in range(1, 11):
        assert hooks.run_step_end(step_end(step))
    assert fired == [3, 6, 9]


def test_hooks_run_in_order_and_a_false_stops_the_rest():
    calls = []
    hooks = Hooks()
    hooks.add("a", lambda at: calls.append("a") or True)
    hooks.add("b", lambda at: calls.append("b") and False)  # stops the run
    hooks.add("c", lambda at: calls.append("c") or True)
    assert not hooks.run_step_end(step_end(1))
    assert calls == ["a", "b"]


def test_a_hook_setting_stop_lets_the_later_hooks_run_first():
    calls = []

    def reach_target(at):
        calls.append("eval")
        at.stop = True
        return True

    hooks = Hooks()
    hooks.add("eval", reach_target)
    hooks.add("checkpoint", lambda at: calls.append("checkpoint") or True)
    assert not hooks.run_step_end(step_end(1))
    assert calls == ["eval", "checkpoint"]


def test_bracket_runs_around_the_step_and_at_close():
    calls = []
    hooks = Hooks()
    hooks.bracket(
        lambda step: calls.append(("before", step)),
        lambda step, out: calls.append(("dispatched", step, out)),
        lambda: calls.append("close"),
    )
    hooks.run_before(4)
    hooks.run_dispatched(4, "m")
    hooks.close()
    assert calls == [("before", 4), ("dispatched", 4, "m"), "close"]


def fake_loop(calls: list, log_every: int, reach_target: bool = False):
    """What `standard_hooks` needs of a TrainLoop, recording each call."""

    def record(name, result=True):
        return lambda *args: calls.append(name) or result

    window = SimpleNamespace(before_step=record("p"), after_step=record("p"), close=record("p"))
    return SimpleNamespace(
        profile=window,
        trainer=SimpleNamespace(
            config=SimpleNamespace(train=SimpleNamespace(log_every_steps=log_every))
        ),
        ledger=SimpleNamespace(book=record("goodput")),
        _log=record("progress"),
        _saves_ok=record("saves_ok"),
        _eval_boundary=record("eval", reach_target),
        _save=record("checkpoint"),
        _stop_preempted=record("preemption"),
    )


def test_the_standard_order_eval_before_save_at_a_shared_boundary():
    calls = []
    hooks = standard_hooks(fake_loop(calls, log_every=2))
    assert hooks.names() == ["progress", "goodput", "saves_ok", "eval", "checkpoint", "preemption"]
    assert hooks.run_step_end(step_end(4, boundary=True, save=True))
    assert calls == ["progress", "goodput", "saves_ok", "eval", "checkpoint"]
    calls.clear()
    assert hooks.run_step_end(step_end(5))  # not logged: one process checks saves only
    assert calls == ["saves_ok"]


def test_the_target_stops_the_run_after_the_save_and_preemption_last():
    calls = []
    hooks = standard_hooks(fake_loop(calls, log_every=10, reach_target=True))
    assert not hooks.run_step_end(step_end(3, boundary=True, save=True))
    assert calls == ["saves_ok", "eval", "checkpoint"]  # stopped once the save is written
    calls.clear()
    loop = fake_loop(calls, log_every=10)
    assert not standard_hooks(loop).run_step_end(step_end(7, save=True, preempted=True))
    assert calls == ["saves_ok", "checkpoint", "preemption"]
