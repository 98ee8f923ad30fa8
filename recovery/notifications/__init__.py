"""Telling people and agents, never inside the request that caused it: notifications through an
outbox, and resume/cancel commands pushed to a run's resume_url.

- ``outbox``: raising a notification (one outbox row per channel that takes the event, written
  in the event's transaction) and what each event says.
- ``delivery``: delivering one outbox row (claim, send by e-mail, webhook, Slack, Teams or
  PagerDuty, record the attempt, retry with backoff), and answering a Slack interaction.
- ``email_links``: an approval e-mail's Approve and Reject links for the people who may decide
  it (signed, bound, short-lived, single-use) and who gets them.
- ``pagerduty``: what a PagerDuty channel pages about, and the Events API v2 events (trigger,
  acknowledge, resolve by dedup key) that follow what became of it.
- ``command_push``: pushing a resume or cancel command to its run's resume_url, signed.
"""
