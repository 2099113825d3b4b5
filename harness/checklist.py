"""The grader's checklist: the seeds' own verification items ("Проверка"), 24 rows over BE-JOB-001…007, plus three
level-5 rows (pipeline versions) from the state contract's own sentence.

Each requirement of the seeds ends with a list of what must be tested. Every entry of those lists is one row here,
with an id like ``BE-JOB-006.2``, the seed's words, their meaning in English, the grade level from which the row is
required, the invariants (checkers) that judge it, and its proof: what must have been observed for the row to pass.
Scenarios say which rows they provoke (``verifies = [...]`` in their TOML). A row passes only when a scenario
provoking it ran, none of its checks was invalid or unknown, and every claim of its proof was observed: a claim is met
by an exercised, valid verdict of one of its checks — ``check:tag`` only when that verdict says it observed the event
the row names (``Verdict.proves``: an ack compared with a commit, copies that raced). A check that had nothing to
look at, or looked at something else, proves nothing. A requirement passes only when every row it requires does.
The rows and their wording are data; the rules that judge them are ``grade.checklist_rows``.

Row statuses (the same words in the terminal, summary.md, results.json, junit and the HTML pages; see
:data:`ROW_STATUSES`): ``pass``; ``fail``; ``unknown`` (a check behind it could not tell); ``not proven`` (what the
row names was never observed: the scenarios behind it were skipped — the row says which capability the adapter must
declare — or ran without the event); ``missing`` (the catalogue provokes it nowhere); ``not required`` (above the
grade's level). A check's verdict that is valid but was not exercised is shown as ``not exercised``, never valid.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    id: str
    seed: str  # the seed's own words (Russian), as the row's source of truth
    meaning: str  # what the harness provokes and checks, in English
    level: int  # required by a grade at this level or above
    checks: tuple[str, ...]  # invariants that judge the row: any invalid or unknown one decides it
    # What must be observed for the row to pass: every claim met, each by one of its alternatives ("check" exercised
    # and valid, or "check:tag" whose valid verdict proves the tag). Empty: one claim, any of ``checks``.
    proof: tuple[tuple[str, ...], ...] = ()

    @property
    def claims(self) -> tuple[tuple[str, ...], ...]:
        return self.proof or (tuple(self.checks),)

    @property
    def requirement(self) -> str:
        return self.id.split(".")[0]


ITEMS: tuple[Item, ...] = (
    Item("BE-JOB-001.1", "integration-тест crash до и после фиксации",
         "a crash before and after the result's commit loses no accepted work", 3,
         ("lost_accepted_work", "ack_after_commit")),
    Item("BE-JOB-001.2", "тест недоступности хранилища и broker",
         "storage (database, S3) and the broker unavailable: nothing accepted is lost, and no delivery of "
         "unfinished work is acked while a dependency fails", 3,
         ("lost_accepted_work", "dropped_delivery"),
         # dropped_delivery judges the row (an ack of unfinished work during an outage) but nothing is lost is the claim.
         (("lost_accepted_work",),)),
    Item("BE-JOB-001.3", "сопоставление подтверждения с транзакционной границей",
         "the ack matched against the transaction boundary: an uncommitted delivery is still unacked in the queue", 3,
         ("ack_after_commit", "delivery_accounting", "dropped_delivery"),
         # Only a consumer crash before its commit, with the delivery seen surviving it, compares an ack with a commit;
         # delivery_accounting (loops, leftovers) judges the row but cannot prove it.
         (("ack_after_commit:ack_vs_commit",),)),
    Item("BE-JOB-002.1", "последовательная и конкурентная повторная доставка",
         "sequential and concurrent redelivery (of a message, or of an upload under one Idempotency-Key): one "
         "ready, one effect per key", 3,
         ("duplicate_effects", "upload_idempotency")),
    Item("BE-JOB-002.2", "тест restart между эффектом и подтверждением",
         "a restart between the effect and the ack: the redelivery is a no-op", 3,
         ("duplicate_effects",)),
    Item("BE-JOB-002.3", "проверка атомарности deduplication",
         "deduplication is atomic: copies racing on two consumers claim and commit once", 3,
         ("duplicate_effects", "copies_raced"),
         (("duplicate_effects",), ("copies_raced:raced",))),
    Item("BE-JOB-003.1", "тест временной и постоянной ошибки",
         "a transient error is retried to success, a permanent one ends terminal", 3,
         ("bounded_retries", "lost_accepted_work", "delivery_accounting", "permanent_failure")),
    Item("BE-JOB-003.2", "тест достижения лимита и наблюдаемого терминального результата",
         "a transient fault that outlasts the retry budget ends failed at the attempt limit with an error_code; "
         "delays grow and spread", 3,
         ("retry_exhaustion",)),
    Item("BE-JOB-003.3", "при наличии изоляции — тест записи и контролируемого replay",
         "what cannot be processed is isolated (dead-lettered) and replayed under control, audited", 4,
         ("replay_audit", "dead_letter", "dead_letter_replay"),
         # Isolation alone (dead_letter, with or without a dead-letter queue) is not the row: the controlled, audited
         # replay of what was isolated or recorded failed is.
         (("replay_audit", "dead_letter_replay"),)),
    Item("BE-JOB-004.1", "тест перестановки и параллельной доставки",
         "permuted and parallel delivery: order does not matter", 3,
         ("order_independence",)),
    Item("BE-JOB-004.2", "тест двух сообщений одного ключа",
         "two messages of one key (one job delivered twice at once): serialised, one effect", 3,
         ("duplicate_effects", "copies_raced"),
         (("duplicate_effects",), ("copies_raced:raced",))),
    Item("BE-JOB-004.3", "нагрузочный тест лимитов prefetch и очереди",
         "under a backlog, unacked deliveries per consumer stay within the declared prefetch", 3,
         ("bounded_concurrency",)),
    Item("BE-JOB-005.1", "тест доставки до и после срока актуальности",
         "delivery before the deadline is processed, after it is expired", 4,
         ("expiry",)),
    Item("BE-JOB-005.2", "тест истечения во время ожидания зависимости",
         "the deadline passes while waiting on a dependency: no effect after it", 4,
         ("expiry",)),
    Item("BE-JOB-005.3", "проверка отсутствия бизнес-эффекта и отдельной метрики истечения",
         "expired work has no business effect and is counted by its own metric", 4,
         ("expiry_metric",)),
    Item("BE-JOB-005.4", "тест согласованности времени producer и consumer",
         "producer and consumer clocks apart (offset, time zone): expiry judged the same", 4,
         ("clock_agreement",)),
    Item("BE-JOB-006.1", "fault-injection тест паузы дольше reservation",
         "a pause longer than the lease: the work is recovered and the old owner fenced", 4,
         ("lease_ownership",)),
    Item("BE-JOB-006.2", "тест отказа и задержки продления",
         "lease renewal delayed and refused: no effect begins without a lease", 4,
         ("lease_renewal",)),
    Item("BE-JOB-006.3", "конкурентный тест прежнего и нового владельца",
         "the old and the new owner at work at once: the stale owner's writes are rejected", 4,
         ("owner_overlap",)),
    Item("BE-JOB-006.4", "проверка отсутствия подтверждения после потери владения",
         "no ack from an owner after it lost the lease", 4,
         ("stale_ack",)),
    Item("BE-JOB-007.1", "тест отказа первого, среднего и последнего элемента",
         "the first, middle or last of several in-flight items fails: the others are neither lost nor redone", 3,
         ("batch_independence",)),
    Item("BE-JOB-007.2", "тест crash после частичной фиксации batch",
         "a crash after part of the in-flight set committed", 3,
         ("batch_independence",)),
    Item("BE-JOB-007.3", "повторная доставка всего batch",
         "the whole in-flight set redelivered: committed items are no-ops", 3,
         ("duplicate_effects",)),
    Item("BE-JOB-007.4", "проверка индивидуальных подтверждений или устойчивых результатов",
         "each item is acked on its own or its result is durable first (no ack across an unfinished item)", 3,
         ("ack_after_commit",)),
    # Level 5 (track 5): not a "Проверка" list of the seeds but the state contract's own sentence (seed 000, the
    # redelivery paragraph): "Конкурентные попытки не перезаписывают более новый pipeline_version. Основной курс
    # использует pipeline_version=1; версионирование нескольких pipeline — трек 5." Three rows, one per scenario.
    Item("BE-JOB-002.4", "версионирование нескольких pipeline — трек 5",
         "roll-out: version-2 consumers beside version 1, an audited idempotent reprocess; both versions ready, "
         "version 1 readable throughout", 5,
         ("version_isolation",)),
    Item("BE-JOB-002.5", "Конкурентные попытки не перезаписывают более новый pipeline_version",
         "a late version-1 attempt or delivery after version 2 is ready leaves the version-2 result untouched", 5,
         ("version_isolation",)),
    Item("BE-JOB-002.6", "Нельзя откатывать ready в processing из-за старого дубля",
         "rollback to version 1: nothing ready regresses, no newer version's effect is overwritten", 5,
         ("version_isolation",)),
)

BY_ID = {item.id: item for item in ITEMS}


def wiring_problems(checkers=None) -> list[str]:
    """Rows naming a checker that is not registered, or asking ``check:tag`` for a tag that checker does not declare
    among its ``PROVES`` (harness/checkers/: both come from the checker modules themselves). Empty: all wired."""
    if checkers is None:
        from .checkers import CHECKERS as checkers
    problems = []
    for item in ITEMS:
        for check in item.checks:
            if check not in checkers:
                problems.append(f"{item.id}: check {check!r} is no registered checker")
        for claim in item.claims:
            for alternative in claim:
                check, _, tag = alternative.partition(":")
                if check not in item.checks:
                    problems.append(f"{item.id}: proof {alternative!r} names a check the row does not list")
                elif tag and check in checkers and tag not in getattr(checkers[check], "PROVES", ()):
                    problems.append(f"{item.id}: {check} declares no PROVES tag {tag!r}")
    return problems


# Row statuses: (symbol, junit element or None for a passing testcase), in the order a summary lists them.
ROW_STATUSES: dict[str, tuple[str, str | None]] = {
    "tampered": ("🚫", "failure"),
    "pass": ("✅", None),
    "fail": ("❌", "failure"),
    "unknown": ("❔", "error"),
    "not proven": ("❓", "error"),
    "missing": ("⛔", "error"),
    "not required": ("⏭", "skipped"),
}
NOT_EXERCISED = "not exercised"


def shown_status(verdict: dict) -> str:
    """How a check's verdict is shown everywhere: its status, except a valid check that was not exercised, which
    proved nothing and is shown as ``not exercised`` (never green)."""
    status = verdict.get("status")
    if status == "valid" and not verdict.get("exercised", True):
        return NOT_EXERCISED
    return status


def satisfies(alternative: str, verdict: dict) -> bool:
    """Whether an exercised, valid ``verdict`` meets one alternative of a claim ("check" or "check:tag")."""
    check, _, tag = alternative.partition(":")
    if verdict.get("invariant") != check or verdict.get("status") != "valid" or not verdict.get("exercised", True):
        return False
    return not tag or tag in (verdict.get("proves") or ())


def capability_hint(skipped: dict) -> str:
    """What the implementation must declare (or the grade provide) for a skipped scenario to run."""
    needs = list(skipped.get("needs") or [])
    if needs:
        return "; ".join(n if " " in n else f"declare [capabilities] {n} = true in the adapter" for n in needs)
    return skipped.get("reason") or "it was skipped"
