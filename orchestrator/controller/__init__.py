"""The controller's lifecycle: prepare (dry-run), up (launch and record), down."""
