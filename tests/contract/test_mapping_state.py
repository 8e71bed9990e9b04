"""The mapping engine's state-store paths on SQLite and Postgres alike: the engine tests of
tests/unit/test_mapping.py (SQLite only there: unit means no service) that write mapped
instances through each dialect's own SQL (expansion, closing, refusals, clear and mark of an
instance, clear of the mapped task, cancel), collected here with this suite's `store`
fixture, which gives both databases."""

from __future__ import annotations

from tests.unit.test_mapping import (
    test_a_crash_before_publishing_leaves_one_set_published_later,
    test_a_failed_instance_fails_the_mapped_task_once_all_ended,
    test_a_list_over_max_map_length_fails_the_mapped_task_saying_why,
    test_a_redelivered_upstream_success_creates_no_second_set,
    test_an_empty_list_skips_the_mapped_task_and_what_is_below,
    test_cancelling_a_mapped_task_cancels_its_unfinished_instances,
    test_clear_one_index_runs_it_again_and_the_reduce_after_it,
    test_clearing_the_mapped_task_expands_it_again,
    test_instances_run_with_their_element_and_reduce_gets_results_in_order,
    test_marking_an_instance_failed_fails_the_mapped_task,
)

__all__ = [
    "test_a_crash_before_publishing_leaves_one_set_published_later",
    "test_a_failed_instance_fails_the_mapped_task_once_all_ended",
    "test_a_list_over_max_map_length_fails_the_mapped_task_saying_why",
    "test_a_redelivered_upstream_success_creates_no_second_set",
    "test_an_empty_list_skips_the_mapped_task_and_what_is_below",
    "test_cancelling_a_mapped_task_cancels_its_unfinished_instances",
    "test_clear_one_index_runs_it_again_and_the_reduce_after_it",
    "test_clearing_the_mapped_task_expands_it_again",
    "test_instances_run_with_their_element_and_reduce_gets_results_in_order",
    "test_marking_an_instance_failed_fails_the_mapped_task",
]
