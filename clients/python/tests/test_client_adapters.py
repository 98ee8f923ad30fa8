"""The framework adapters are packages (``saga_client.langgraph``, ``saga_client.openai_agents``)
whose ``__init__`` re-exports what their private modules define, with an explicit ``__all__``;
without their framework, importing one is an ``ImportError`` and ``saga_client`` itself still
imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

ADAPTERS = {
    "saga_client.langgraph": ["ToolRejected", "resume_when_decided", "saga_tool", "saga_tools"],
    "saga_client.openai_agents": ["saga_decisions", "saga_function_tool"],
}


@pytest.mark.parametrize("module", sorted(ADAPTERS))
def test_each_adapter_exports_its_documented_names(module):
    adapter = pytest.importorskip(module)
    assert sorted(adapter.__all__) == ADAPTERS[module]
    for name in adapter.__all__:
        defined_in = getattr(adapter, name).__module__
        assert defined_in.startswith(f"{module}._"), (name, defined_in)


@pytest.mark.parametrize(
    "module, framework",
    [
        ("saga_client.langgraph", "langchain_core"),
        ("saga_client.langgraph", "langgraph"),
        ("saga_client.openai_agents", "agents"),
    ],
)
def test_without_its_framework_an_adapter_is_an_import_error(module, framework):
    code = (
        f"import sys; sys.modules[{framework!r}] = None\n"
        "import saga_client\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('imported without its framework')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
