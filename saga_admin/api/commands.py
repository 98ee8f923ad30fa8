"""Commands: an agent reads the resume/cancel commands pending for its run and acknowledges them."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router

from recovery import selectors as recovery_selectors
from recovery.actions import commands
from recovery.models import AgentCommand
from saga_admin.api.auth import AUTH_ERRORS, agent_auth, reader_auth
from saga_admin.api.common import WRITE_ERRORS, actor_of, check_id, reach_of, run_for
from saga_admin.api.schemas.commands import AgentCommandsOut, CommandOut

# Writes as an agent unless an operation says ``auth=reader_auth`` (saga_admin.api.common).
router = Router(tags=["agents"], auth=agent_auth)


@router.get(
    "/runs/{run_id}/commands",
    response={200: AgentCommandsOut, **AUTH_ERRORS},
    auth=reader_auth,
    summary="Pending resume/cancel commands for the agent",
)
def run_commands(request: HttpRequest, run_id: str) -> AgentCommandsOut:
    run = run_for(request, run_id)
    pending = recovery_selectors.commands_pending(run=run)
    return AgentCommandsOut(commands=[CommandOut.from_orm(command) for command in pending])


@router.post(
    "/commands/{command_id}/ack",
    response={200: CommandOut, **WRITE_ERRORS},
    summary="Acknowledge a command (harmless to repeat)",
)
def command_ack(request: HttpRequest, command_id: str) -> CommandOut:
    check_id("Command", command_id)
    command = reach_of(request, write=True).get(
        AgentCommand.objects.select_related("run__tenant", "checkpoint"), command_id, owner_field="run__owner"
    )
    return CommandOut.from_orm(commands.command_ack(command=command, actor=actor_of(request)))
