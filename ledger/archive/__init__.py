"""Retention's archives, as the record sees them: where a tenant's archive may go
(``destinations``: the operator's allow-list, the tenant's folder), what an archived run looks like
(``format``: JSON lines and a signed manifest, pure), how its files are written and read
(``storage``: a file URL or S3) and how they are verified offline (``verify``). What is archived
and when, and the removal from PostgreSQL, are ``recovery.archive``'s."""
