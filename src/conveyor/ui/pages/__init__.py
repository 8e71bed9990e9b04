"""One module per page (and its JSON endpoints); each has `register(ui)`: see conveyor.ui."""
