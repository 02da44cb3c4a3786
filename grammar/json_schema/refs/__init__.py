"""JSON Schema references: `$id` / `$anchor` / relative URIs made local, `$dynamicRef` resolved
statically through the dynamic scope."""
