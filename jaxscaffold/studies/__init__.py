"""Studies: arms x seeds of training runs, summarised with their uncertainty (`runner`,
`stats`, `report`)."""
