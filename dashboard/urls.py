from __future__ import annotations

from django.urls import path

from dashboard.views import (
    actions,
    audit_stream,
    away,
    bulk,
    email_decision,
    inbox,
    insights,
    items,
    notifications,
    pauses,
    policies,
    queue,
    runs,
    runs_list,
    saved_filters,
    slack_account,
    slack_confirm,
    unwinds,
)

app_name = "dashboard"

urlpatterns = [
    path("", queue.queue, name="queue"),
    path("queue/new", queue.queue_new, name="queue-new"),
    path("queue/bulk", queue.queue_bulk, name="queue-bulk"),
    path("queue/decide-all", bulk.bulk_preview, name="bulk-preview"),
    path("bulk/<str:bulk_id>/", bulk.bulk_detail, name="bulk-detail"),
    path("bulk/<str:bulk_id>/abort", bulk.bulk_abort, name="bulk-abort"),
    path("runs/", runs_list.runs_list, name="runs"),
    path("queue/saved-filters", saved_filters.saved_filter_create, name="saved-filter-create"),
    path(
        "queue/saved-filters/<int:pk>/rename", saved_filters.saved_filter_rename, name="saved-filter-rename"
    ),
    path(
        "queue/saved-filters/<int:pk>/delete", saved_filters.saved_filter_delete, name="saved-filter-delete"
    ),
    path("runs/<str:run_id>/", runs.run_detail, name="run-detail"),
    path("runs/<str:run_id>/live", runs.run_live, name="run-live"),
    path("runs/<str:run_id>/trail", runs.run_trail, name="run-trail"),
    path("runs/<str:run_id>/flag", runs.run_flag, name="run-flag"),
    path("runs/<str:run_id>/cancel", runs.run_cancel, name="run-cancel"),
    path("items/<str:item_id>/compensate", items.item_compensate, name="item-compensate"),
    path("items/<str:item_id>/resume", items.item_resume, name="item-resume"),
    path("items/<str:item_id>/close", items.item_close, name="item-close"),
    path("items/<str:item_id>/assign", items.item_assign, name="item-assign"),
    path("unwinds/<str:unwind_id>/progress", unwinds.unwind_progress, name="unwind-progress"),
    path("unwinds/<str:unwind_id>/stop", unwinds.unwind_stop, name="unwind-stop"),
    path("steps/<str:step_id>/ask-again", unwinds.step_ask_again, name="step-ask-again"),
    path("steps/<str:step_id>/retry", unwinds.step_retry, name="step-retry"),
    path("steps/<str:step_id>/skip", unwinds.step_skip, name="step-skip"),
    path("actions/<str:action_id>/reconcile", actions.action_reconcile, name="action-reconcile"),
    path("approvals/", inbox.approvals, name="approvals"),
    # An approval e-mail's Approve or Reject link: GET shows, POST decides (recovery.notifications.email_links).
    path("approvals/email/<str:link>/", email_decision.email_decision, name="email-decision"),
    path("approvals/<str:approval_id>/approve", inbox.approval_approve, name="approval-approve"),
    path("approvals/<str:approval_id>/reject", inbox.approval_reject, name="approval-reject"),
    path("away/", away.away, name="away"),
    path("insights/", insights.insights, name="insights"),
    # The insights page's old address (/metrics, without the slash, is Prometheus's).
    path("metrics/", insights.insights_moved, name="insights-moved"),
    path("policies/", policies.policies, name="policies"),
    path(
        "policies/<int:tenant_id>/compensators/<int:compensator_id>/check",
        policies.compensator_check,
        name="compensator-check",
    ),
    path("audit-stream/", audit_stream.page, name="audit-stream"),
    path("audit-stream/<slug:slug>/sinks", audit_stream.sink_set, name="audit-sink-set"),
    path("pauses/", pauses.pauses, name="pauses"),
    path("pauses/<str:pause_id>/lift", pauses.pause_lift, name="pause-lift"),
    path("notifications/", notifications.outbox, name="notifications"),
    path("notifications/settings/", notifications.settings_page, name="notification-settings"),
    path("notifications/settings/<slug:slug>/channels", notifications.channel_create, name="channel-create"),
    path("notifications/settings/<slug:slug>/slack", notifications.slack_app, name="slack-app"),
    path("notifications/channels/<str:channel_id>/edit", notifications.channel_edit, name="channel-edit"),
    path(
        "notifications/channels/<str:channel_id>/delete", notifications.channel_delete, name="channel-delete"
    ),
    path("notifications/channels/<str:channel_id>/test", notifications.channel_test, name="channel-test"),
    path(
        "notifications/slack-users/<int:link_id>/remove",
        slack_account.slack_link_remove,
        name="slack-user-remove",
    ),
    path("account/slack/", slack_account.slack_account, name="slack-account"),
    path("account/slack/<slug:slug>/code", slack_account.slack_link_code, name="slack-link-code"),
    path("account/slack/confirm/<str:token>/", slack_confirm.slack_press_confirm, name="slack-press-confirm"),
]
