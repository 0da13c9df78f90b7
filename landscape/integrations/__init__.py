"""Bridges to other libraries' training loops; each module imports its library only when used."""
