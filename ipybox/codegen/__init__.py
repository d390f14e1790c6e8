"""Code generation: typed Python modules from MCP servers' tool schemas, and the stubs shown to models.

``_codegen`` connects to a server, lists its tools and writes the package that ``_sources`` builds;
``_schema`` cleans the untrusted schemas, ``_modelgen`` turns them into pydantic models through
datamodel-code-generator, whose output ``_modelcheck`` checks before use; ``_names`` and
``_pysource`` make identifiers and literals that cannot carry code, and ``_stubs`` renders the
generated packages for a prompt. The public names (`generate_mcp_sources`, `render_tool_stubs`)
are exported by ``ipybox``.
"""
