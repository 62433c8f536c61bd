-- ------------------------------------------------------------------------------------------------------------
-- A keyword-only store's labels from an LLM labeller
-- ------------------------------------------------------------------------------------------------------------
-- A store with no embedding column has no clusters.  Offline, its topics are phrases mined from its files
-- (storetopics._store_phrases).  With an LLM labeller, one call per store turns its contrastive terms and those
-- phrases into 3-8 labels, under the rules a cluster's label follows: the keyword gate decides when they are due
-- again, each label is checked for its form (label_ok), screened (screen()) and grounded (every word among what the
-- labeller was shown), a failed call keeps the old labels and is retried with backoff.  The LLM sees these words
-- and phrases and the other stores' names and terms, never the corpus.

-- The gate (called by refresh_words when the store changed): the labels are due when the store has none yet, or when
-- its contrastive terms moved by more than keyword_shift since they were made (storetopics._words_moved, as for a
-- cluster).  Returns 1 when they became due.
CREATE OR REPLACE FUNCTION storetopics._store_label_gate(p_source int, p_store text) RETURNS int
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_cfg jsonb := storetopics._settings(p_source);
  v_terms text[];
BEGIN
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store;
  IF NOT FOUND OR st.store_label_needed OR NOT storetopics._llm_labeller(p_source) OR st.files <= 0 THEN
    RETURN 0;
  END IF;
  v_terms := ARRAY(SELECT c.lexeme FROM storetopics._contrast_shown(p_source, p_store, 80) c ORDER BY c.rank LIMIT 15);
  IF cardinality(v_terms) = 0
     OR (st.store_label_words IS NOT NULL
         AND storetopics._words_moved(st.store_label_words, v_terms) <= (v_cfg ->> 'keyword_shift')::float8 * 10) THEN
    RETURN 0;
  END IF;
  UPDATE storetopics.store_state SET store_label_needed = true, store_label_failures = 0, store_label_retry_at = NULL
   WHERE source_id = p_source AND store_key = p_store;
  RETURN 1;
END $$;

-- What the labeller is given for a keyword-only store whose labels are due (no row otherwise): its first 30
-- contrastive terms as people write them, the phrases mined from its files, and the catalog's other stores.
CREATE OR REPLACE FUNCTION storetopics._store_labels_due(p_source int, p_store text)
RETURNS TABLE (terms text[], phrases text[], others text[], files bigint, failures int)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_lexemes text[];
  v_words text[];
BEGIN
  SELECT * INTO st FROM storetopics.store_state s
   WHERE s.source_id = p_source AND s.store_key = p_store AND s.store_label_needed AND s.files > 0
     AND coalesce(s.store_label_retry_at, '-infinity') <= now();
  IF NOT FOUND OR NOT storetopics._llm_labeller(p_source) THEN
    RETURN;
  END IF;
  -- the contrastive terms render shows (so the phrases mined here are those render shows offline, mined once)
  SELECT array_agg(c.lexeme ORDER BY c.rank), (array_agg(c.word ORDER BY c.rank))[1:30] INTO v_lexemes, v_words
    FROM storetopics._contrast_shown(p_source, p_store, 80) c;
  RETURN QUERY SELECT v_words, storetopics._store_phrases(p_source, p_store, v_lexemes),
                      storetopics._other_stores(p_source, p_store), st.files, st.store_label_failures;
END $$;

-- Write back one call for a keyword-only store's labels (the ledger records it, cluster NULL):
--   'ok':       each label that passes label_ok, screen() and grounding (its words among the terms and phrases the
--               labeller was shown) is kept, up to 8, repeats dropped; the detail names those refused; none kept
--               counts as rejected;
--   'rejected': no labels (the answer had no label's form): the mined phrases are shown, not asked again until the
--               terms move;
--   'error':    no answer: the old labels stay, a retry is scheduled with backoff.
-- Returns the labels the store holds now (NULL when the store is gone).
CREATE OR REPLACE FUNCTION storetopics._record_store_labels(p_source int, p_store text, p_outcome text, p_labels text[],
                                                p_labeller text, p_model text DEFAULT NULL, p_input_tokens int DEFAULT 0,
                                                p_output_tokens int DEFAULT 0, p_detail text DEFAULT NULL)
RETURNS text[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  st storetopics.store_state;
  v_cfg regconfig := (SELECT s.ts_config FROM storetopics.sources s WHERE s.id = p_source);
  v_outcome text := p_outcome;
  v_detail text := p_detail;
  v_lexemes text[];
  v_words text[];
  v_grounds text[];
  v_kept text[] := '{}';
  v_refused text[] := '{}';
  v_why text;
  l text;
BEGIN
  SELECT * INTO st FROM storetopics.store_state WHERE source_id = p_source AND store_key = p_store FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM storetopics._ledger(p_source, p_store, NULL, p_labeller, p_model, p_input_tokens, p_output_tokens,
                                CASE WHEN p_outcome = 'error' THEN 'error' ELSE 'rejected' END, 'the store is gone');
    RETURN NULL;
  END IF;
  SELECT array_agg(c.lexeme ORDER BY c.rank), array_agg(c.word ORDER BY c.rank) INTO v_lexemes, v_words
    FROM storetopics._contrast_shown(p_source, p_store, 80) c;
  IF v_outcome = 'ok' THEN
    v_grounds := coalesce(v_lexemes[1:30], '{}') || tsvector_to_array(to_tsvector(v_cfg,
                   coalesce(array_to_string(v_words[1:30], ' '), '') || ' ' || coalesce(array_to_string(st.phrases, ' '), '')));
    FOREACH l IN ARRAY coalesce(p_labels, '{}') LOOP
      l := trim(l);
      v_why := CASE WHEN NOT storetopics._label_ok(l) THEN 'not a 2-5 word label'
                    WHEN storetopics._screen(l) IS NOT NULL THEN 'screened: ' || storetopics._screen(l)
                    WHEN NOT tsvector_to_array(to_tsvector(v_cfg, l)) <@ v_grounds
                      THEN 'not grounded: a word of it is not in the store''s terms or phrases'
                    WHEN lower(l) = ANY (ARRAY(SELECT lower(k) FROM unnest(v_kept) k)) THEN 'repeated'
                    WHEN cardinality(v_kept) >= 8 THEN 'more than 8' END;
      IF v_why IS NULL THEN
        v_kept := v_kept || l;
      ELSE
        v_refused := v_refused || (left(l, 60) || ' (' || v_why || ')');
      END IF;
    END LOOP;
    v_outcome := CASE WHEN cardinality(v_kept) > 0 THEN 'ok' ELSE 'rejected' END;
    v_detail := nullif(array_to_string(v_refused, '; '), '');
    IF v_outcome = 'rejected' THEN
      v_detail := coalesce(v_detail, 'no labels');
    END IF;
  END IF;
  PERFORM storetopics._ledger(p_source, p_store, NULL, p_labeller, p_model, p_input_tokens, p_output_tokens,
                              v_outcome, v_detail);
  IF v_outcome = 'error' THEN
    UPDATE storetopics.store_state
       SET store_label_error = left(v_detail, 500), store_label_failures = store_label_failures + 1,
           store_label_retry_at = storetopics._retry_at(store_label_failures)
     WHERE source_id = p_source AND store_key = p_store;
    RETURN st.store_labels;
  END IF;
  UPDATE storetopics.store_state
     SET store_labels = CASE WHEN v_outcome = 'ok' THEN v_kept END, store_label_words = v_lexemes[1:15],
         store_label_needed = false, store_label_failures = 0, store_label_retry_at = NULL,
         store_label_error = CASE WHEN v_detail IS NOT NULL THEN left(v_outcome || ': ' || v_detail, 500) END,
         version = version + 1
   WHERE source_id = p_source AND store_key = p_store;
  RETURN CASE WHEN v_outcome = 'ok' THEN v_kept ELSE '{}' END;
END $$;

-- What \df+ shows a DBA.
COMMENT ON FUNCTION storetopics._store_labels_due(int, text) IS
  'For a keyword-only store whose labels are due from the configured LLM labeller: what it may see (contrastive terms, mined phrases, the other stores); no row otherwise.';
COMMENT ON FUNCTION storetopics._record_store_labels(int, text, text, text[], text, text, int, int, text) IS
  'Record the call for a keyword-only store''s labels in the ledger and keep each label that passes label_ok, screen() and the grounding check; errors schedule a retry with backoff. Returns the labels held.';
