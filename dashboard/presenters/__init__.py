"""What the dashboard shows, shaped in one place so the templates only render it.

- ``approval_cards``: what an approval card says will happen (forward actions and compensation
  steps), the rule and limit that decided it, and the "1 of 2 approvers" line.
- ``images``: an action's before-image, after-image and what its undo read, side by side with the
  differences marked, and whether the undo was verified (the run page).
- ``charts``: the geometry of the server-side SVG bar charts (insights page).
"""
