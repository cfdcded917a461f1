package orchestrator

import "text/template"

// defaultPrompts are the built-in prompts of backlog runs, by role; a
// backlog file's prompts override them. They are Go templates over
// backlogPromptData.
var defaultPrompts = map[string]string{
	"iterate": `You are working through the task backlog of {{.Project}}, one task per run, with fresh context each run.

Your working directory is a fresh workspace: the inputs are in in/ and your outputs go in out/, both relative to it. Do not change in/.
{{- if .Sources}}
The project's source files are in in/: {{range $i, $s := .Sources}}{{if $i}}, {{end}}{{$s}}{{end}}.
{{- end}}

## Your task: {{.Task.ID}} — {{.Task.Title}}

{{.TaskJSON}}

## The whole task list

{{.TaskList}}
Work on {{.Task.ID}} only. When you stop, write the file out/summary.json containing one JSON object:
- "task_id": "{{.Task.ID}}";
- "status": "done" when the task is finished, "blocked" when you cannot go on (say why in "blockers"), "doing" when it needs another run;
- "summary": what you did, in a few sentences;
- "files": the files you changed (optional);
- "blockers": what stops you (optional);
- "new_tasks": tasks you found that are not in the list (optional), each an object with "title", and optionally "id", "description", "priority" (1 is the highest), "depends_on" (ids), "tags", "files", "steps".
Write valid JSON.
`,
	"review": `You are reviewing the task backlog of {{.Project}}: no task is left to run.

Your working directory is a fresh workspace: the inputs are in in/ and your outputs go in out/, both relative to it. Do not change in/.
{{- if .Sources}}
The project's source files are in in/: {{range $i, $s := .Sources}}{{if $i}}, {{end}}{{$s}}{{end}}.
{{- end}}

## The task list

{{.TaskList}}
Check that the work the project's sources ask for is covered. Write the file out/summary.json containing one JSON object:
- "task_id": "review";
- "status": "done";
- "summary": your verdict in a few sentences;
- "new_tasks": the tasks still needed (leave it out or empty when nothing is missing), each an object with "title", and optionally "id", "description", "priority" (1 is the highest), "depends_on" (ids).
Write valid JSON.
`,
	"bootstrap": `You are starting the task backlog of {{.Project}}: there are no tasks yet.

Your working directory is a fresh workspace: the inputs are in in/ and your outputs go in out/, both relative to it. Do not change in/.
{{- if .Sources}}
Read the project's source files in in/: {{range $i, $s := .Sources}}{{if $i}}, {{end}}{{$s}}{{end}}.
{{- end}}

Break the work they describe into tasks small enough for one agent run each. Write the file out/to-do.json:
{"schema_version": 1, "project": {"name": "{{.Project}}"}, "source_files": [...], "tasks": [...]}
where each task has "id" (like "T001"), "title", "status": "todo", and optionally "description", "priority" (1 is the highest), "depends_on" (ids of tasks that must be done first), "steps", "files", "tags".
Write valid JSON.
`,
	"repair": `The task file of {{.Project}} is invalid. It is in in/{{.Input.Name}}.

Your working directory is a fresh workspace: the inputs are in in/ and your outputs go in out/, both relative to it. Do not change in/.

Its problems:
{{.ImportErrors}}

Write the repaired file to out/to-do.json. Keep every task and its status; fix only what the problems name (unique ids, dependencies that exist, no dependency cycles, valid statuses, the members of the schema).
Write valid JSON.
`,
}

// Bounds of a PromptCache: prompt texts are a pipeline's (one a step,
// backlog role or loop level), so many definitions' fit; when either bound
// would be passed, the cache starts again empty. A parsed template is
// counted as promptCost of its text.
const (
	maxCachedPrompts    = 256
	maxCachedPromptCost = 16 << 20
)

// promptCost is an upper estimate of the memory a parsed prompt holds:
// measured, about 2 KiB a template and at most 34 bytes per byte of text
// (a text of nothing but {{.Step}} actions; plain text 1.4).
func promptCost(text string) int { return 2<<10 + 34*len(text) }

// PromptCache keeps prompt templates parsed, by their text, so that a job
// request renders its prompt without parsing it again. A rendering clones
// the template it is given, so a parsed one is never changed. It is not
// safe for concurrent use (the service decides under its lock); a nil
// cache parses at each use.
type PromptCache struct {
	byText map[string]*template.Template
	cost   int // of the templates kept (promptCost)
}

// NewPromptCache returns an empty cache.
func NewPromptCache() *PromptCache {
	return &PromptCache{byText: map[string]*template.Template{}}
}

// parse returns text's template, parsed as every prompt is.
func (c *PromptCache) parse(text string) (*template.Template, error) {
	if c == nil {
		return parsePrompt(text)
	}
	if t, ok := c.byText[text]; ok {
		return t, nil
	}
	t, err := parsePrompt(text)
	if err != nil {
		return nil, err
	}
	cost := promptCost(text)
	if len(c.byText) >= maxCachedPrompts || c.cost+cost > maxCachedPromptCost {
		clear(c.byText)
		c.cost = 0
	}
	if cost <= maxCachedPromptCost {
		c.byText[text] = t
		c.cost += cost
	}
	return t, nil
}
