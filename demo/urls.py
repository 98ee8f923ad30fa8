from __future__ import annotations

from django.urls import path

from demo import views

app_name = "demo"

# Forward operations first (what agents call), then /saga/ endpoints (what Saga Admin's webhook
# compensators call), each system under its own prefix as if it were its own service.
urlpatterns = [
    path("", views.overview, name="overview"),
    path("hr/users", views.hr_users, name="hr-users"),
    path("hr/users/<str:email>", views.hr_user, name="hr-user"),
    path("hr/users/<str:email>/title", views.hr_user_title, name="hr-user-title"),
    path("hr/saga/delete_user", views.saga_delete_user, name="hr-delete-user"),
    path("workspace/licenses", views.workspace_licenses, name="workspace-licenses"),
    path("workspace/saga/cancel_license", views.saga_cancel_license, name="workspace-cancel-license"),
    path("email/messages", views.email_messages, name="email-messages"),
    path("email/drafts", views.email_drafts, name="email-drafts"),
    path("email/saga/send_correction", views.saga_send_correction, name="email-send-correction"),
    path("crm/tickets/<str:ticket_id>", views.crm_ticket, name="crm-ticket"),
    path("crm/contacts/<str:contact_id>", views.crm_contact, name="crm-contact"),
    path("crm/saga/restore_ticket", views.saga_restore_ticket, name="crm-restore-ticket"),
    path("payments/charges", views.payments_charges, name="payments-charges"),
    path("payments/refunds", views.payments_refunds, name="payments-refunds"),
    path("payments/saga/refund", views.saga_refund, name="payments-refund"),
]
