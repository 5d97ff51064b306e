package main

// A mutation is a small, realistic bug written into the library as
// search/replace edits: one a future change could introduce, none of
// them a chaos plant. Each edit's Old must occur in its file exactly once
// (or at least once with All), so that a mutation whose code has moved is
// reported as not applying rather than run as a silent no-op.
type mutation struct {
	Name  string
	Pkg   string // the package it breaks
	What  string // the bug, in a line
	Store string // the records store the soak runs with: redis or postgres
	Edits []edit
}

// edit replaces Old by New in File (relative to the repository root).
type edit struct {
	File string
	Old  string
	New  string
	All  bool // replace every occurrence (there must be one at least)
}

// mutations are the score's mutations. Keep them small and against lines
// that rarely change; -check tells which still apply.
//
// Not here: an Atomic completion without its lease-end check
// (pgr-commit-after-lease, in the score until 5 December). It changes
// nothing a client can see: every takeover of an expired claim writes a
// new token, which the completion still checks, so without the lease-end
// check a holder can only commit when nobody took its key over, and its
// one answer is then as good as the retry's would have been. No history
// tells the two apart; the soak cannot catch it, and no test could.
var mutations = []mutation{
	{
		Name: "mw-renewal-not-rearmed", Pkg: "middleware", Store: "redis",
		What: "the claim's lease is renewed once, then never again (the renewal timer is not reset)",
		Edits: []edit{{File: "middleware/lease.go",
			Old: "\t\tcancel()\n\t\tst.renewer.Reset(every)\n",
			New: "\t\tcancel()\n"}},
	},
	{
		Name: "mw-atomic-answer-before-commit", Pkg: "middleware", Store: "postgres",
		What: "an Atomic route's answer is sent to the client before its transaction commits",
		Edits: []edit{{File: "middleware/atomic.go",
			Old: "\terr = tx.Commit(st.storeCtx(), done)\n",
			New: "\tst.cw.send(res)\n\terr = tx.Commit(st.storeCtx(), done)\n"}},
	},
	{
		Name: "fp-path-values-dropped", Pkg: "fingerprint", Store: "redis",
		What: "the route fingerprint counts the path parameters but not their values (/tasks/1/export = /tasks/2/export)",
		Edits: []edit{{File: "fingerprint/route.go",
			Old: "\tfor _, v := range values {\n\t\tb = appendStr(b, v)\n\t}\n",
			New: "\tfor range values {\n\t}\n"}},
	},
	{
		Name: "ks-owner-from-tenant", Pkg: "keyspace", Store: "redis",
		What: "the key's owner segment is hashed from the tenant instead of the user (a key derived from less)",
		Edits: []edit{{File: "keyspace/keyspace.go",
			Old: "\tuser := sha256.Sum256(in[:copy(in[:], s.User)])\n",
			New: "\tuser := sha256.Sum256(in[:copy(in[:], s.Tenant)])\n"}},
	},
	{
		Name: "pgr-ident-without-fingerprint", Pkg: "pgrecords", Store: "postgres",
		What: "a record's identity holds owner and kind but not the fingerprint: a drifted retry is replayed",
		Edits: []edit{{File: "pgrecords/record.go",
			Old: "\tb = appendStr(b, kind)\n\treturn append(b, fp...)\n",
			New: "\tb = appendStr(b, kind)\n\treturn b\n"}},
	},
	{
		Name: "pgs-finish-overwrites-cancel", Pkg: "pgstore", Store: "redis",
		What: "an attempt's finish overwrites a cancel recorded while it ran",
		Edits: []edit{
			{File: "pgstore/queries.go",
				Old: "\tstate = CASE WHEN t.finished_at IS NOT NULL THEN 'cancelled' ELSE x.state END,\n",
				New: "\tstate = x.state,\n"},
			{File: "pgstore/queries.go",
				Old: "\tstate = CASE WHEN finished_at IS NOT NULL THEN 'cancelled' ELSE @to::text END,\n",
				New: "\tstate = @to::text,\n"},
		},
	},
	{
		Name: "pgs-finish-unfenced", Pkg: "pgstore", Store: "redis",
		What: "a batched finish is not fenced by the attempt: any attempt's outcome ends the task",
		Edits: []edit{{File: "pgstore/queries.go",
			Old: "WHERE t.id = locked.id AND t.attempt = x.attempt AND t.state = 'running'\n",
			New: "WHERE t.id = locked.id\n"}, {File: "pgstore/queries.go",
			Old: "JOIN x ON t.id = x.id::uuid AND t.attempt = x.attempt\n\tWHERE t.state = 'running'\n",
			New: "JOIN x ON t.id = x.id::uuid\n\tWHERE true\n"}},
	},
	{
		Name: "pgs-heartbeat-unconfirmed", Pkg: "pgstore", Store: "redis",
		What: "a heartbeat extends the lease in the database but does not move the attempt's own deadline",
		Edits: []edit{{File: "pgstore/heartbeat.go",
			Old: "\t\t\ta.confirm(sent, h.lease)\n",
			New: "\t\t\t_ = sent\n"}},
	},
	{
		Name: "pgs-max-running-off-by-one", Pkg: "pgstore", Store: "redis",
		What: "a claim leaves room for one attempt more than MaxRunning",
		Edits: []edit{{File: "pgstore/queries.go",
			Old: "CASE WHEN l.max_running > 0 THEN greatest(0, l.max_running\n",
			New: "CASE WHEN l.max_running > 0 THEN greatest(0, l.max_running + 1\n"}},
	},
	{
		Name: "pgs-per-tenant-off-by-one", Pkg: "pgstore", Store: "redis",
		What: "a tenant counts as capped only past MaxRunningPerTenant, and a claim gives it one more",
		Edits: []edit{
			{File: "pgstore/queries.go",
				Old: "SELECT kind, tenant FROM running WHERE n >= per_tenant\n",
				New: "SELECT kind, tenant FROM running WHERE n > per_tenant\n"},
			{File: "pgstore/queries.go",
				Old: "\t\t\t<= lim.per_tenant - (SELECT count(*) FROM idemgate_tasks h\n",
				New: "\t\t\t<= lim.per_tenant + 1 - (SELECT count(*) FROM idemgate_tasks h\n"},
		},
	},
	{
		Name: "pgs-pause-ignored", Pkg: "pgstore", Store: "redis",
		What: "a paused kind's claims go on (the paused flag is not read)",
		Edits: []edit{{File: "pgstore/queries.go",
			Old: "CASE WHEN l.paused OR ",
			New: "CASE WHEN false OR "}},
	},
	{
		Name: "pgs-turn-zero", Pkg: "pgstore", Store: "redis",
		What: "Submit gives every task turn 0: claims go by age, one tenant's backlog first (no fairness)",
		Edits: []edit{{File: "pgstore/queries.go",
			Old: "\treturn `greatest(0,\n",
			New: "\treturn `0 * greatest(0,\n"}},
	},
	{
		Name: "pgs-recover-any-owner", Pkg: "pgstore", Store: "redis",
		What: "Recover checks the tenant but not the owner: a user recovers a colleague's task",
		Edits: []edit{{File: "pgstore/queries.go",
			Old: "\tWHERE id = @id::uuid AND tenant = @tenant AND owner = @owner AND state = 'failed'\n",
			New: "\tWHERE id = @id::uuid AND tenant = @tenant AND state = 'failed'\n"}},
	},
}
