-- storetopics 0.2: a store's tool name is decided once, when the store first appears, and never changes: a client
-- that saved a tool name, or a prompt that mentions it, keeps working when other tables are attached or detached.
-- Unique over every store (a newcomer whose name is taken gets a suffix; storetopics._name_stores).
ALTER TABLE storetopics.store_state ADD COLUMN tool_name text;
CREATE UNIQUE INDEX store_state_tool_name ON storetopics.store_state (tool_name);
