"""The audit stream to a SIEM: every audit event, in order per tenant, at least once, to the
installation's and each tenant's sinks, with signed chain heads.

``config`` (which sinks, the key, a tenant's sink checked), ``records`` (the messages: events,
signed chain heads, syslog and HEC framing, and a SIEM's check of what it received),
``transport`` (syslog over TCP or TLS, HEC over HTTPS), ``delivery`` (the per-sink cursor the
worker's periodic duty moves, and the lag the dashboard shows).
"""
