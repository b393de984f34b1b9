"""The control topic: messages every instance of an application reads (e.g. shut down all)."""
