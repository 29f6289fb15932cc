"""groupwise imports without the integrations' extras; groupwise.langgraph says which install it needs.

Run in a subprocess whose import system hides langchain, langgraph and mcp, as on a machine without
them (they are installed here, for the other tests)."""

from __future__ import annotations

import subprocess
import sys

HIDE = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('langchain_core', 'langchain_openai', 'langgraph', 'mcp'):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""

CHECK = HIDE + """
import groupwise as gw
from groupwise.mcp import MCPTool, generate_scenarios, complete_task_tool
assert gw.Trajectory and complete_task_tool.name == 'complete_task'
try:
    import groupwise.langgraph
except gw.GroupwiseError as exc:
    assert isinstance(exc, ImportError)
    print(exc)
else:
    raise SystemExit('groupwise.langgraph imported without LangChain')
"""


def test_groupwise_imports_without_the_extras_and_langgraph_says_what_to_install():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'groupwise[langgraph]'" in out.stdout
    assert "langchain-core" in out.stdout  # the package that is missing, by its pip name
