"""Generated code (see fjord.tools.genproto)."""
