"""Retention to S3: the same archives, written through boto3 to a real S3 API on this machine
(moto in server mode), confirmed by reading back, verified offline; another bucket or prefix than
the operator allows is refused."""

from __future__ import annotations

import gzip
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from ledger.models import ArchivedRun, Run
from recovery.archive import runner
from tests.recovery.archive_support import KEY, age, allow, closed_run, retention, verify_archive
from tests.support.api import Api, error_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def bucket(s3, settings) -> str:
    settings.AUDIT_KEY = KEY
    name = s3.new_bucket()
    allow(settings, f"s3://{name}/saga")
    settings.SAGA = {**settings.SAGA, "ARCHIVE_S3_ENDPOINT_URL": s3.endpoint}
    return name


def test_runs_are_archived_to_s3_and_verify_from_there(bucket, s3, tenant, agent, operator_key):
    retention(tenant, f"s3://{bucket}/saga/prod")
    first, second = age(closed_run(tenant, agent)), age(closed_run(tenant, agent, email="b@company.com"))
    result = runner.runs_archive()
    assert sorted(o.run_id for o in result.archived) == sorted([first.pk, second.pk]) and result.errors == []
    assert not Run.objects.filter(pk__in=[first.pk, second.pk]).exists()
    assert (
        ArchivedRun.objects.get(run_id=first.pk).archive
        == f"s3://{bucket}/saga/prod/acme/runs/{first.pk}/manifest.json"
    )
    keys = sorted(item["Key"] for item in s3.client().list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == sorted(
        f"saga/prod/acme/runs/{run.pk}/{name}"
        for run in (first, second)
        for name in ("manifest.json", "records.jsonl.gz")
    )
    out, _ = verify_archive(f"s3://{bucket}/saga")
    assert "2 archived runs checked" in out and "Archive intact" in out

    # The API answers for the run where it went: 410 archived, naming the S3 manifest.
    response = Api(operator_key[1]).get(f"/runs/{first.pk}")
    assert response.status_code == 410
    assert error_of(response)["code"] == "archived"
    assert (
        error_of(response)["details"]["archive"]
        == f"s3://{bucket}/saga/prod/acme/runs/{first.pk}/manifest.json"
    )

    # An event line edited in place (re-gzipped) on the server: verify names the run and the line.
    key = f"saga/prod/acme/runs/{first.pk}/records.jsonl.gz"
    lines = gzip.decompress(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read()).splitlines()
    last = json.loads(lines[-1])
    last["row"]["actor_label"] = "someone else"
    edited = gzip.compress(b"\n".join([*lines[:-1], json.dumps(last).encode()]) + b"\n")
    s3.client().put_object(Bucket=bucket, Key=key, Body=edited)
    err = StringIO()
    with pytest.raises(CommandError) as excinfo:
        call_command("verify_audit", archive=f"s3://{bucket}/saga", stdout=StringIO(), stderr=err)
    assert excinfo.value.returncode == 1 and "1 of 2 archived runs do not verify" in str(excinfo.value)
    assert f"run {first.pk}" in err.getvalue() and f"line {len(lines)}: event" in err.getvalue()


def test_verify_reaches_s3_through_boto3s_own_endpoint_setting(
    bucket, s3, tenant, agent, settings, monkeypatch
):
    retention(tenant, f"s3://{bucket}/saga")
    age(closed_run(tenant, agent))
    runner.runs_archive()
    settings.SAGA = {**settings.SAGA, "ARCHIVE_S3_ENDPOINT_URL": ""}
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    assert "Archive intact" in verify_archive(f"s3://{bucket}/saga")[0]


def test_another_bucket_or_prefix_is_refused(bucket, s3, tenant):
    other = s3.new_bucket()
    from ledger.policies.errors import PolicyFileError

    for archive in (f"s3://{other}/saga", f"s3://{bucket}/other", f"s3://{bucket}/saga/../other"):
        with pytest.raises(PolicyFileError, match="audit.retention: archive: "):
            retention(tenant, archive)
    assert "Contents" not in s3.client().list_objects_v2(Bucket=other)


def test_an_unreachable_store_archives_nothing_and_says_so(bucket, tenant, agent, settings):
    retention(tenant, f"s3://{bucket}/saga")
    run = age(closed_run(tenant, agent))
    settings.SAGA = {**settings.SAGA, "ARCHIVE_S3_ENDPOINT_URL": "http://127.0.0.1:9"}
    result = runner.runs_archive()
    assert result.archived == [] and result.errors and "cannot write" in result.errors[0]
    assert Run.objects.filter(pk=run.pk).exists() and not ArchivedRun.objects.exists()
