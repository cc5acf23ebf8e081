"""asyncrt: run computation graphs across several devices from async Python."""
