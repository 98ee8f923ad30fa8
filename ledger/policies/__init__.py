"""Tool policies: the policy file, and which policy governs a call. One module per job:

- ``load``: loading a policy file (``manage.py load_policies``): read, parse either layout,
  replace one scope's policies in one transaction, and the warnings about what was loaded.
- ``schema``: the native layout as pydantic models, every field's check and each entry's
  coherence.
- ``agent_safety``: the ``agentSafety`` layout translated into the native one.
- ``errors``: ``PolicyFileError`` and the messages that name each problem's entry and field.
- ``resolve``: which policy governs a tool call (precedence, the default policy, the layered
  policy settings) and the per-process cache under the policy stamp.
- ``compensation_args``: the templates a policy builds its compensating tool's args from.
- ``rules``: the language of a policy's rules and limits (conditions that fail closed on types)
  and their compiled forms; ``rule_checks`` validates them, ``rule_compile`` compiles them,
  ``rule_words`` says them in plain words.
"""
