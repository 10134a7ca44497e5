"""The supervisor's stop policy, pure: what a stop signal, a failed worker, a change of the
world, a second signal and the end of a grace period lead to.

Plain data in (:class:`StopState`, :class:`StopRules`, the event, the monotonic time ``now``),
plain data out (:class:`Action`: the next state and what the engine does). The engine
(:mod:`.engine`) only carries the actions out: it sends the signals, prints the lines and asks
for the hang report. The rules:

* A signal to forward that is not a stop signal (:data:`~unirank.signals.STOP_SIGNALS`; by
  default SIGUSR1 and SIGUSR2) goes to every live worker, its process alone.
* The first stop signal (:data:`~unirank.signals.STOP_SIGNALS`: SIGTERM, SIGINT, SIGHUP,
  SIGQUIT, which torchrun treats alike) is forwarded to every worker's process group and
  starts the grace period, after which every worker left gets SIGKILL; a second one kills at
  once; a worker it ends is stopped, not failed, and no restart follows. Under Slurm
  (``slurm_kills``) SIGTERM starts no grace period and a second one is only forwarded:
  Slurm sends it to every process of the step and SIGKILL KillWait seconds later, which is
  the workers' time to save a checkpoint.
* With the hang report asked for at a stop (:mod:`.stopreport`, the node of rank 0) and some
  rank waiting in a collective, the first stop signal (not Slurm's SIGTERM) waits for the
  report (once per run); it is forwarded when the report has ended or could not be made; a
  second stop signal meanwhile gives the report up and kills at once. Where the report found
  ranks whose collectives can never return (their calls do not match:
  :func:`~unirank.hang.detect.cannot_return`), the workers that wait in a collective are
  ended as when a node is gone (below): their stop handler cannot run, and waiting out the
  grace period would only delay the end (a pod's own SIGKILL often comes first).
* The first worker that fails (:func:`is_failure`; not one that ends after a stop signal or a
  change of the world) is the first failure: the others get SIGTERM and the grace period (no
  line when its own failure record is a configuration error, whose one line says it all).
* A worker ended by a signal that was forwarded to it alone (SIGUSR1, SIGUSR2: its program
  does not handle it) was stopped, not failed: the run is stopped by that signal
  (:func:`on_forwarded_end`: the others get SIGTERM and the grace period, no restart).
* A change of the world (the dynamic rendezvous: a node lost, one waiting to join) while no
  worker failed and no stop signal came stops the workers the same way; where a node is gone
  (every change but nodes joining), every :data:`~unirank.contract.LOST_PEER_WAIT` seconds
  (``peer_wait``) until the grace period ends, the workers that wait in a collective (their
  hang watcher's :class:`~unirank.hang.waits.CollectiveMark`) get SIGKILL at once: their
  collective waits for the node that is gone and holds the main thread, so their stop
  handler (``ur.stop_requested()``) cannot act on the SIGTERM, while a worker that computes
  keeps the whole grace period to save. So does a worker
  stuck in D state past TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT (:mod:`.dstate`; the
  attempt is then the last).
* At the end of the grace period every worker left gets SIGKILL, and the engine waits
  ``kill_wait`` seconds more for them to vanish; then it gives up on the ones left.

Reads no environment variable.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, replace

from unirank.contract import LOST_PEER_WAIT
from unirank.exitcodes import REQUEUE as REQUEUE_EXIT_CODE
from unirank.signals import STOP_SIGNALS
from unirank.supervisor.summary import signal_name
from unirank.words import counted

__all__ = [
    "Action",
    "StopRules",
    "StopState",
    "is_failure",
    "is_first_failure",
    "on_first_failure",
    "on_forwarded_end",
    "on_report_end",
    "on_signal",
    "on_tick",
    "on_world_change",
]


#: why the workers that wait in a collective are ended early (their line says it)
NODE_GONE_WHY = "with a node that is gone"
CANNOT_RETURN_WHY = "that cannot return (the ranks' calls do not match)"


@dataclass(frozen=True)
class StopRules:
    """The settings of one supervisor that the policy follows."""

    #: seconds between the stop's SIGTERM and the SIGKILL
    grace_period: float
    #: seconds to wait for the workers to vanish after SIGKILL
    kill_wait: float
    #: the signals the supervisor handles and forwards
    signals: tuple[int, ...]
    #: under Slurm, whose SIGTERM comes with a SIGKILL KillWait seconds later
    slurm_kills: bool = False
    #: seconds between two looks for workers waiting in a collective once a node is gone
    peer_wait: float = LOST_PEER_WAIT


@dataclass(frozen=True)
class StopState:
    """Where one attempt's stop stands."""

    #: the stop signal forwarded to the workers (None: none yet)
    stop_signal: int | None = None
    #: a worker failed first, on its own account
    failed: bool = False
    #: the change of the world that stopped the workers (None: none did), and its kind
    #: (:mod:`.rdzv.messages`)
    world_changed: str | None = None
    world_change_kind: str | None = None
    #: the line naming the workers stuck in D state that stopped the others (None: none did)
    stuck: str | None = None
    #: the stop signal that waits for the hang report (None: no report being made)
    reporting: int | None = None
    #: the hang report was asked for (it is asked for once per run at most)
    report_asked: bool = False
    #: when (``time.monotonic()``) the grace period, or the wait after SIGKILL, ends
    deadline: float | None = None
    #: SIGKILL was sent: at the deadline the engine gives up on the workers left
    killing: bool = False
    #: a node is gone, or the stop's hang report found collectives that cannot return: when
    #: (``time.monotonic()``) to end the workers that wait in a collective (None: neither,
    #: or the workers are being killed)
    peer_deadline: float | None = None
    #: why those workers are ended, for their line (``with a node that is gone``)
    waiting_why: str = ""


@dataclass(frozen=True)
class Action:
    """What the engine does next; ``state`` replaces the one it had."""

    state: StopState
    #: a line for the console (empty: none)
    say: str = ""
    #: send this signal to every live worker, its process alone (not a stop)
    forward: int | None = None
    #: send this stop signal to every live worker's process group (noted on each worker)
    stop: int | None = None
    #: send SIGKILL to every live worker's process group (noted on each worker)
    kill: bool = False
    #: start the hang report (then, whether or not it could start, call :func:`on_report_end`
    #: when it ended)
    ask_report: bool = False
    #: give the report being made up, without showing it
    drop_report: bool = False
    #: the wait after SIGKILL is over: stop waiting for the workers left
    give_up: bool = False
    #: SIGKILL now to the workers that wait in a collective (``state.waiting_why``), noted on
    #: each
    end_waiting: bool = False


def is_failure(returncode: int) -> bool:
    """Whether a worker's end is a failure: not 0, and not the requeue's exit code (it saved
    its checkpoint and stopped to run again)."""
    return returncode not in (0, REQUEUE_EXIT_CODE)


def is_first_failure(state: StopState, returncode: int) -> bool:
    """Whether a worker that ended with ``returncode`` is the first failure: it failed, and no
    worker failed before it, no stop signal came and the world did not change."""
    return (is_failure(returncode) and not state.failed and state.stop_signal is None
            and state.world_changed is None and state.stuck is None)


def _grace(state: StopState, rules: StopRules, now: float) -> StopState:
    """``state`` with the grace period started, unless it runs already."""
    if state.deadline is not None:
        return state
    return replace(state, deadline=now + rules.grace_period)


def _ending_waiting(state: StopState, rules: StopRules, now: float,
                    why: str) -> StopState | None:
    """``state`` with the workers that wait in a collective ended after ``rules.peer_wait``
    seconds (``why``: for their line); None where the grace period ends first."""
    if rules.peer_wait >= rules.grace_period:
        return None
    return replace(state, peer_deadline=now + rules.peer_wait, waiting_why=why)


def _kill(state: StopState, rules: StopRules, now: float) -> Action:
    return Action(replace(state, killing=True, deadline=now + rules.kill_wait,
                          peer_deadline=None), kill=True)


def on_signal(state: StopState, signum: int, rules: StopRules, now: float,
              report_wanted: Callable[[], bool] = lambda: False) -> Action:
    """A signal came to the supervisor (``report_wanted``: whether a hang report would be made
    now, asked only where it could be).

    SIGCHLD and signals the supervisor does not handle change nothing (the loop reaps after
    every wake-up)."""
    if signum not in rules.signals:
        return Action(state)
    if signum not in STOP_SIGNALS:
        return Action(state, forward=signum)
    return _on_stop_signal(state, signum, rules, now, report_wanted)


def _on_stop_signal(state: StopState, signum: int, rules: StopRules, now: float,
                    report_wanted: Callable[[], bool], cannot_return: bool = False) -> Action:
    # Slurm sends SIGTERM to every process of the step (srun passes on its own too) and
    # SIGKILL after KillWait: the workers get that long to save, no deadline of ours
    slurms = rules.slurm_kills and signum == signal.SIGTERM
    if state.reporting is not None:  # a second one while the report is made: stop now
        action = _kill(replace(state, reporting=None, stop_signal=state.reporting), rules, now)
        return replace(action, drop_report=True)
    if state.stop_signal is None and not state.failed:
        if not slurms and not state.report_asked and report_wanted():
            return Action(replace(state, reporting=signum, report_asked=True), ask_report=True)
        stopped = replace(state, stop_signal=signum)
        if slurms:
            return Action(stopped, stop=signum)
        name = signal_name(signum)
        stopping, waiting = _grace(stopped, rules, now), ""
        ending = _ending_waiting(stopping, rules, now, CANNOT_RETURN_WHY)
        if cannot_return and ending is not None:
            stopping = ending
            waiting = (f"; at {rules.peer_wait:g} s for those waiting in a collective, which "
                       "cannot return")
        return Action(stopping, stop=signum,
                      say=f"got {name}: forwarded to the workers; SIGKILL in "
                          f"{rules.grace_period:g} s{waiting} ({name} again to kill now)")
    if slurms:
        return Action(state, stop=signum)
    return _kill(state, rules, now)


def on_report_end(state: StopState, rules: StopRules, now: float, *,
                  cannot_return: bool = False) -> Action:
    """The hang report ended (shown), its time is up, or it could not start: the stop signal
    that waited for it goes on as a first stop signal. ``cannot_return``: the report found
    ranks waiting in collectives none of them can ever return from (their calls do not
    match): a stop handler cannot run there, so the workers that wait in a collective are
    ended after ``rules.peer_wait`` seconds, as when a node is gone, not after the grace
    period."""
    if state.reporting is None:
        return Action(state)
    return _on_stop_signal(replace(state, reporting=None), state.reporting, rules, now,
                           lambda: False, cannot_return)


def on_first_failure(state: StopState, *, others: int, config_error: bool, who: str,
                     rules: StopRules, now: float) -> Action:
    """The first failure (see :func:`is_first_failure`) was seen: ``others`` workers still
    run; ``who`` says which worker ended and how (``rank 1 (local rank 1) on node n ended
    with exit code 3``); ``config_error``: its record is a configuration error."""
    failed = replace(state, failed=True)
    if not others:
        return Action(failed)
    stopping = _grace(failed, rules, now)
    if config_error:  # its one line says it all
        return Action(stopping, stop=signal.SIGTERM)
    return Action(stopping, stop=signal.SIGTERM,
                  say=f"{who}; stopping the other {counted(others, 'worker')}: SIGTERM now, "
                      f"SIGKILL after {rules.grace_period:g} s")


def on_forwarded_end(state: StopState, signum: int, *, others: int, who: str,
                     rules: StopRules, now: float) -> Action:
    """A worker was ended by signal ``signum``, which the supervisor forwarded to it (not a
    stop signal: SIGUSR1, SIGUSR2; its program does not handle it): it was stopped, not
    failed, so the run is stopped by that signal as by a stop signal (no restart, 128 +
    signal): the ``others`` workers get SIGTERM and the grace period. ``who``: which worker,
    and how it ended. Nothing changes where the workers are being stopped already."""
    if state.failed or state.stop_signal is not None or state.world_changed is not None \
            or state.stuck is not None:
        return Action(state)
    stopped = replace(state, stop_signal=signum)
    if not others:
        return Action(stopped)
    return Action(_grace(stopped, rules, now), stop=signal.SIGTERM,
                  say=f"{who}, forwarded to it by the launcher (its program does not handle "
                      f"it); stopping the other {counted(others, 'worker')}: SIGTERM now, "
                      f"SIGKILL after {rules.grace_period:g} s")


def on_world_change(state: StopState, change: str, *, alive: bool, rules: StopRules,
                    now: float, node_gone: bool = False, kind: str | None = None) -> Action:
    """The world changed (``change`` says how, in one line; ``kind``: its kind): stop the
    workers, unless they are being stopped already or none runs; ``node_gone``: a node is gone
    (lost, frozen, evicted, the store moved, a peer's new round: every change but nodes
    joining), and the workers that wait in a collective are ended after ``rules.peer_wait``
    seconds."""
    if state.failed or state.stop_signal is not None or not alive:
        return Action(state)
    stopping = _grace(replace(state, world_changed=change, world_change_kind=kind), rules, now)
    waiting = ""
    ending = _ending_waiting(stopping, rules, now, NODE_GONE_WHY)
    if node_gone and ending is not None:
        stopping = ending
        waiting = f" (at {rules.peer_wait:g} s for those waiting in a collective)"
    return Action(stopping, stop=signal.SIGTERM,
                  say=f"{change}; stopping the workers: SIGTERM now, SIGKILL after "
                      f"{rules.grace_period:g} s{waiting}")


def on_stuck(state: StopState, line: str, *, rules: StopRules, now: float) -> Action:
    """Workers stayed in D state past the timeout (``line`` names them): stop every worker,
    unless they are being stopped already."""
    if state.failed or state.stop_signal is not None or state.world_changed is not None:
        return Action(state)
    return Action(_grace(replace(state, stuck=line), rules, now), stop=signal.SIGTERM,
                  say=f"{line}; stopping the workers: SIGTERM now, SIGKILL after "
                      f"{rules.grace_period:g} s")


def on_tick(state: StopState, rules: StopRules, now: float) -> Action:
    """The loop woke up at ``now``: at the end of the grace period, SIGKILL; at the end of the
    wait after it, give up; before, where a node is gone, every ``rules.peer_wait`` seconds:
    SIGKILL to the workers that wait in a collective."""
    if state.deadline is None or now < state.deadline:
        if state.peer_deadline is None or now < state.peer_deadline or state.killing:
            return Action(state)
        return Action(replace(state, peer_deadline=now + rules.peer_wait), end_waiting=True)
    if state.killing:
        return Action(state, give_up=True)
    return _kill(state, rules, now)
