"""This host's part in the job's side channel, from the join to the end: the choreography that
`job.Job` runs through, over the master's `Coordinator` and this host's `Member`.

The master serves the side channel and looks up the names of the hosts that have not joined;
every host joins it (or is told why it cannot), learns which hosts share its machine, posts
why it cannot go on, and at the end says it is done and closes. The key every host derives
alike from the job's facts (`session_key`) is the one home of that derivation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from container_entry.common import stopping
from container_entry.common.errors import NetworkError
from container_entry.common.exits import ExitCode
from container_entry.common.logs import log
from container_entry.common.records import RankRecord
from container_entry.common.stopping import StopSignal
from container_entry.diagnose.arrivals import RankArrivals
from container_entry.diagnose.culprit import RankCalls
from container_entry.hosts import network
from container_entry.hosts.keys import job_key
from container_entry.hosts.liveness import JOIN_VERDICT_GRACE
from container_entry.hosts.master import Coordinator
from container_entry.hosts.member import Member, PeerFailure
from container_entry.plan import cluster
from container_entry.plan.environment import Environment
from container_entry.plan.plan import Plan


def session_key(env: Environment) -> bytes:
    """The key every host of this job derives alike for the side channel (hosts.keys), from the
    facts its cluster source gives every host alike (plan.cluster)."""
    return job_key(env.environ, cluster.key_facts(env))


class Session:
    """The side channel as this host takes part in it: the master's coordinator (on node rank
    0) and this host's member, once joined."""

    def __init__(self, plan: Plan, key: bytes) -> None:
        self.plan = plan
        self.key = key
        self.coordinator: Coordinator | None = None
        self.member: Member | None = None
        self.machine: tuple[int, int] | None = None  # hosts and workers sharing this machine

    def join(self) -> Plan:
        """Multi-host: resolve what this host needs, join the side channel, before anything.

        Under the static rendezvous every worker dials only the master (peers learn each
        other's addresses through its store) and the side channel is the master's too, so a
        coordinated host waits for the master's name alone, and the master only for the names
        of hosts that have not joined: no host resolves every name. Under c10d (restarts) each
        host advertises its own name, so all are waited for (in parallel). Returns the plan
        as the join leaves it (hosts of this job that share the machine share its cores).
        """
        plan, topology = self.plan, self.plan.topology
        names = cluster.source_of(topology).names_to_wait_for(
            topology,
            c10d=plan.max_restarts > 0,
            store=plan.master_addr if plan.dials_store else None,
            side_channel=plan.coordination_addr if plan.coordinated else None,
        )
        if names:
            network.wait_for_hosts(names, plan.settings.host_wait_timeout)
        if not plan.coordinated:
            return plan
        if topology.current_host == topology.coordinator:
            self._serve()
        self._join_side_channel()
        self._share_machine()
        return self.plan

    def _serve(self) -> None:
        """The master: the side channel for every host, and the names of the hosts that have
        not joined yet looked up while the others join (a peer whose name never resolves is
        reported, exit 3; a host that joined needs no name here): N lookups, not N x N."""
        plan, topology = self.plan, self.plan.topology
        if plan.hosts_store:
            network.check_port_free(plan.master_port, "master")
        # only the job's hosts take part: a proven join, from an address of the host it names
        # (looked up as long as this host waits for names), checked before anything
        coordinator = self.coordinator = Coordinator(
            topology.hosts,
            plan.coordination_port,
            hang_timeout=plan.settings.hang_timeout,
            key=self.key,
            resolve=network.addresses,
            address_wait=plan.settings.host_wait_timeout,
        )
        peers = [h for h in topology.hosts if h != topology.current_host]
        try:
            network.wait_for_hosts(
                peers,
                plan.settings.host_wait_timeout,
                resolves=lambda h: coordinator.has_joined(h) or network.name_resolves(h),
            )
        except NetworkError as error:
            self._post_own(error)
            raise

    def _post_own(self, error: NetworkError) -> None:
        """The master's own host cannot go on: tell the others through its side channel."""
        if self.coordinator is not None:
            what = f"{type(error).__name__}: {error}"
            self.coordinator.post(self.host_failure(what, error.exit_code))

    def _join_side_channel(self) -> None:
        """Join the master's side channel and wait for every host; the master decides who
        never joined, and a member gives its verdict time to arrive."""
        plan, topology = self.plan, self.plan.topology
        member = self.member = Member(
            topology.current_host,
            plan.coordination_addr,
            plan.coordination_port,
            machine=plan.boot_id,
            workers=plan.workers,
            key=self.key,
        )
        timeout = plan.settings.join_timeout
        master = topology.current_host == topology.coordinator
        try:
            member.join(timeout, verdict_grace=0.0 if master else JOIN_VERDICT_GRACE)
        except PeerFailure:
            raise
        except NetworkError as error:
            if member.refused and self.coordinator:  # the master's own host: tell the rest
                self._post_own(error)
                raise
            missing = self.coordinator.missing() if self.coordinator else []
            if missing and not member.refused:  # refused: its own words say why
                text = f"host(s) {', '.join(missing)} never joined the job within {timeout:g} s"
                what = f"{text} (the master {topology.current_host} gave up waiting)"
                self.post(self.host_failure(what, ExitCode.NETWORK))
                raise NetworkError(text) from None
            raise

    def shared(self, plan: Plan) -> Plan:
        """`plan` (built again once the code is here) as the join left this host's: hosts of
        this job on one machine share its cores."""
        self.plan = plan.sharing_machine(*self.machine) if self.machine else plan
        return self.plan

    def _share_machine(self) -> None:
        """Hosts of this job on one machine (SDK local mode) share its cores."""
        assert self.member is not None
        hosts, workers = self.machine = self.member.machine_share()
        shared = self.plan.sharing_machine(hosts, workers)
        if shared is not self.plan:
            self.plan = shared
            threads = shared.env["OMP_NUM_THREADS"]
            log(f"OMP_NUM_THREADS={threads.value}: {threads.reason}")

    # -- what the supervising side asks of the side channel (on one host: nothing to ask) -----
    @property
    def coordinated(self) -> bool:
        """This host takes part in a side channel (several hosts, joined)."""
        return self.member is not None

    def post(self, failure: RankRecord) -> None:
        """Tell the other hosts why this one cannot go on, the one way to: a rank's failure (in
        its words, `failure.summarized`), a stop with its moment, a bootstrap error or the
        final verdict of a run nothing was posted for yet (`host_failure`). Posts once (but
        for an earlier rank's failure turning up); never echoes a failure another host
        relayed (member.post_failure)."""
        if self.member:
            self.member.post_failure(failure)

    def host_failure(self, what: str, exit_code: int, stop: StopSignal | None = None) -> RankRecord:
        """This host's failure that is no rank's, in words; a stop has its moment."""
        here = self.plan.topology.current_host
        began = stop.at if stop is not None else None
        return RankRecord(here, None, returncode=exit_code, what=what, stop=stop, failed_at=began)

    def relayed(self) -> RankRecord | None:
        """Another host's failure, stop or the master's hang verdict, as the master relayed it."""
        member = self.member
        return member.abort if member and member.aborted.is_set() else None

    def relayed_at(self) -> float | None:
        """When that word arrived, on this host's clock."""
        return self.member.aborted_at if self.member else None

    def lost_master(self) -> str | None:
        """The master host, once its bootstrap went away before this one finished."""
        member = self.member
        return member.master if member and member.lost_master else None

    def interrupted(self) -> bool:
        """Either of the two: the job cannot go on here."""
        return self.member is not None and self.member.aborted.is_set()

    def report_idle(self, idle: Callable[[], float | None] | None) -> None:
        """How long this host's ranks have been silent, sent with each heartbeat (the master's
        hang watchdog); None: no longer."""
        if self.member:
            self.member.idle = idle

    def share_records(self, ranks: Sequence[RankCalls]) -> str | None:
        """This host's ranks' collective records to the master; the culprit it names once every
        host's are in (or the wait is over)."""
        if not self.member or self.member.lost_master:
            return None
        self.member.post_records(ranks)
        return self.member.hang_culprit()

    def post_arrivals(self, ranks: Sequence[RankArrivals]) -> None:
        """This host's ranks' straggler summaries to the master (a member that is not it)."""
        if self.member and not self.member.lost_master:
            self.member.post_arrivals(ranks)

    def take_arrivals(self) -> list[RankArrivals]:
        """The master: every other host's summaries since the last call, on its clock."""
        return self.coordinator.take_arrivals() if self.coordinator else []

    @property
    def analyses(self) -> bool:
        """This host lines every host's records up: the master, or the only host."""
        return self.member is None or self.coordinator is not None

    def hang_culprit(self) -> str | None:
        """The culprit the master named from every host's records."""
        if not self.member or self.member.lost_master:
            return None
        return self.member.hang_culprit()

    def settle(self) -> None:
        """Every failure of this host's own that may be the job's first is posted."""
        if self.member:
            self.member.settle()

    def first_failure(self, timeout: float) -> RankRecord | None:
        """The job's first failure as the master decided it for good (None: none in time)."""
        return self.member.first_failure(timeout) if self.member else None

    def peers_running(self) -> Callable[[], bool] | None:
        """On the coordinator where its torchrun hosts its world's store: whether another host
        of that world still runs workers (the store must stay up for them); elsewhere None."""
        coordinator, plan = self.coordinator, self.plan
        if coordinator is None or not plan.hosts_store:
            return None
        others = set(plan.topology.world) - {plan.topology.current_host}
        return lambda: bool(coordinator.unfinished() & others)

    def close(self, succeeded: bool) -> None:
        """Done (after a success), then closed. The coordinator serves until every other host
        is done, left or went silent (a world or a host that trains longer than this one's
        keeps its side channel; liveness bounds the wait for a dead or frozen one), or a stop
        came; after a failure, which it relayed, a few seconds."""
        if self.member:
            if succeeded:
                self.member.done()
            self.member.close()
        if self.coordinator:
            if succeeded and not self.coordinator.all_finished():
                log("waiting for the other hosts to finish (this host serves the side channel)")
            self.coordinator.wait_finished(math.inf if succeeded else 5.0, stopping.stopped_late)
            self.coordinator.close()
