"""How big each phase's work is: the full run's sizes and the smoke run's (seconds, to prove the
harness works), and the client counts the load phases share."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Sizes:
    window_s: float
    warmup_s: float
    l3_jobs: int
    l3_chain: int
    runs: int
    actions_per_run: int
    open_items: int
    pending_approvals: int
    resolved_items: int
    big_run_actions: int
    small_fraction: float
    page_samples: int
    deep_pages: int
    unwind_steps: int
    concurrent_unwinds: int
    scale_steps: int
    server_candidates: int | None
    bulk_items: int
    bulk_preview_samples: int
    # Items of the in-process profile of the decisions (bench/bulk.py ``profile``).
    bulk_profile_items: int
    # How long the bulk is expected to take (runs are made for the append over that long) and
    # how long it may (then it is reported as timed out).
    bulk_expected_s: float
    bulk_timeout_s: float
    # The "at size" phase (bench/size.py): actions seeded (events ~3 per action),
    # open items, the run page's two sizes, chains verified, governed steps timed, runs per archive
    # batch and how long the rest of retention may take.
    size_actions: int = 10_000_000
    size_open_items: int = 2_000
    size_big_runs: tuple[int, ...] = (200, 5_000)
    verify_sample: int = 300
    governed_steps: int = 500
    archive_batch: int = 100_000
    archive_expected_s: float = 120
    retention_timeout_s: float = 3600


FULL = Sizes(
    window_s=15,
    warmup_s=3,
    l3_jobs=500,
    l3_chain=200,
    runs=100_000,
    actions_per_run=10,
    open_items=10_000,
    pending_approvals=1_000,
    resolved_items=5_000,
    big_run_actions=200,
    small_fraction=0.05,
    page_samples=40,
    deep_pages=40,
    unwind_steps=50,
    concurrent_unwinds=20,
    scale_steps=200,
    server_candidates=None,
    bulk_items=10_000,
    bulk_preview_samples=10,
    bulk_profile_items=300,
    bulk_expected_s=120,
    bulk_timeout_s=1200,
)
SMOKE = Sizes(
    window_s=1.0,
    warmup_s=0.3,
    l3_jobs=20,
    l3_chain=10,
    runs=300,
    actions_per_run=4,
    open_items=40,
    pending_approvals=10,
    resolved_items=10,
    big_run_actions=30,
    small_fraction=0.3,
    page_samples=3,
    deep_pages=2,
    unwind_steps=5,
    concurrent_unwinds=3,
    scale_steps=8,
    # One gthread and one granian line beside the Procfile's: proof that each server starts.
    server_candidates=2,
    bulk_items=200,
    bulk_preview_samples=3,
    bulk_profile_items=30,
    bulk_expected_s=10,
    bulk_timeout_s=240,
    size_actions=3_000,
    size_open_items=40,
    size_big_runs=(200, 500),
    verify_sample=20,
    governed_steps=20,
    archive_batch=50,
    archive_expected_s=5,
    retention_timeout_s=120,
)

CLIENT_COUNTS = (1, 16)
# Load generator processes at most (the clients share them).
CLIENT_PROCESSES = 4
