"""Single-object transitions the engine itself makes, below it so that it can call them: a
recovery item's states (``items``: opened, claimed, closed when its unwind finishes) and an
approval's (``approvals``: asked for, granted, withdrawn, with who may decide). Each moves one row
and audits it; deciding what a move means for the run is ``recovery.actions``'s.

They stay out of ``recovery.actions`` because ``recovery.unwinds`` calls them (finishing an unwind
closes its item; a step that needs a person asks for an approval), and the engine stands below the
actions: nothing here imports the engine or the actions.
"""
