"""Telling people and agents, never inside the request that caused it: notifications through an
outbox, and resume/cancel commands pushed to a run's resume_url.

- ``outbox``: raising a notification (one outbox row per channel that takes the event, written
  in the event's transaction) and what each event says.
- ``delivery``: delivering one outbox row (claim, send by e-mail, webhook, Slack or Teams, record
  the attempt, retry with backoff), and answering a Slack interaction.
- ``command_push``: pushing a resume or cancel command to its run's resume_url, signed.
"""
