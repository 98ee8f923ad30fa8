from __future__ import annotations

from django.urls import path

from dashboard import notifications, pauses, slack_account, views

app_name = "dashboard"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("queue/new", views.queue_new, name="queue-new"),
    path("queue/bulk", views.queue_bulk, name="queue-bulk"),
    path("runs/<str:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<str:run_id>/live", views.run_live, name="run-live"),
    path("runs/<str:run_id>/flag", views.run_flag, name="run-flag"),
    path("runs/<str:run_id>/cancel", views.run_cancel, name="run-cancel"),
    path("items/<str:item_id>/compensate", views.item_compensate, name="item-compensate"),
    path("items/<str:item_id>/resume", views.item_resume, name="item-resume"),
    path("items/<str:item_id>/close", views.item_close, name="item-close"),
    path("items/<str:item_id>/assign", views.item_assign, name="item-assign"),
    path("unwinds/<str:unwind_id>/progress", views.unwind_progress, name="unwind-progress"),
    path("unwinds/<str:unwind_id>/stop", views.unwind_stop, name="unwind-stop"),
    path("steps/<str:step_id>/ask-again", views.step_ask_again, name="step-ask-again"),
    path("steps/<str:step_id>/retry", views.step_retry, name="step-retry"),
    path("steps/<str:step_id>/skip", views.step_skip, name="step-skip"),
    path("actions/<str:action_id>/reconcile", views.action_reconcile, name="action-reconcile"),
    path("approvals/", views.approvals, name="approvals"),
    path("approvals/<str:approval_id>/approve", views.approval_approve, name="approval-approve"),
    path("approvals/<str:approval_id>/reject", views.approval_reject, name="approval-reject"),
    path("metrics/", views.metrics, name="metrics"),
    path("policies/", views.policies, name="policies"),
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
]
