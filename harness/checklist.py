"""The grader's checklist: the seeds' own verification items ("Проверка"), 24 rows over BE-JOB-001…007, plus three
level-5 rows (pipeline versions) from the state contract's own sentence.

Each requirement of the seeds ends with a list of what must be tested. Every entry of those lists is one row here,
with an id like ``BE-JOB-006.2``, the seed's words, their meaning in English, the grade level from which the row is
required, and the invariants (checkers) whose exercised, valid verdict proves it. Scenarios say which rows they
provoke (``verifies = [...]`` in their TOML). A row passes only when a scenario provoking it ran and one of its
proving checks was exercised and valid, with none of them invalid or unknown; a requirement passes only when every
row it requires does. The rows and their wording are data; the rules that judge them are ``grade.checklist_rows``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    id: str
    seed: str  # the seed's own words (Russian), as the row's source of truth
    meaning: str  # what the harness provokes and checks, in English
    level: int  # required by a grade at this level or above
    checks: tuple[str, ...]  # invariants that prove the row when exercised and valid

    @property
    def requirement(self) -> str:
        return self.id.split(".")[0]


ITEMS: tuple[Item, ...] = (
    Item("BE-JOB-001.1", "integration-тест crash до и после фиксации",
         "a crash before and after the result's commit loses no accepted work", 3,
         ("lost_accepted_work", "ack_after_commit")),
    Item("BE-JOB-001.2", "тест недоступности хранилища и broker",
         "storage (database, S3) and the broker unavailable: nothing accepted is lost", 3,
         ("lost_accepted_work",)),
    Item("BE-JOB-001.3", "сопоставление подтверждения с транзакционной границей",
         "the ack matched against the transaction boundary: an uncommitted delivery is still unacked in the queue", 3,
         ("ack_after_commit", "delivery_accounting")),
    Item("BE-JOB-002.1", "последовательная и конкурентная повторная доставка",
         "sequential and concurrent redelivery (of a message, or of an upload under one Idempotency-Key): one "
         "ready, one effect per key", 3,
         ("duplicate_effects", "upload_idempotency")),
    Item("BE-JOB-002.2", "тест restart между эффектом и подтверждением",
         "a restart between the effect and the ack: the redelivery is a no-op", 3,
         ("duplicate_effects",)),
    Item("BE-JOB-002.3", "проверка атомарности deduplication",
         "deduplication is atomic: copies racing on two consumers claim and commit once", 3,
         ("duplicate_effects",)),
    Item("BE-JOB-003.1", "тест временной и постоянной ошибки",
         "a transient error is retried to success, a permanent one ends terminal", 3,
         ("bounded_retries", "lost_accepted_work", "delivery_accounting")),
    Item("BE-JOB-003.2", "тест достижения лимита и наблюдаемого терминального результата",
         "a transient fault that outlasts the retry budget ends failed at the attempt limit with an error_code; "
         "delays grow and spread", 3,
         ("retry_exhaustion",)),
    Item("BE-JOB-003.3", "при наличии изоляции — тест записи и контролируемого replay",
         "what cannot be processed is isolated (dead-lettered) and replayed under control, audited", 4,
         ("replay_audit", "dead_letter", "dead_letter_replay")),
    Item("BE-JOB-004.1", "тест перестановки и параллельной доставки",
         "permuted and parallel delivery: order does not matter", 3,
         ("order_independence",)),
    Item("BE-JOB-004.2", "тест двух сообщений одного ключа",
         "two messages of one key (one job delivered twice at once): serialised, one effect", 3,
         ("duplicate_effects",)),
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
