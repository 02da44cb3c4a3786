"""Tool calling and reasoning: call formats, the request's tools, strict calls as phases."""
