package schemas

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Sentinel errors of the catalogue.
var (
	// ErrUnknownType: the event type is not in the catalogue.
	ErrUnknownType = errors.New("unknown event type")
	// ErrInvalidData: the event data does not satisfy its JSON Schema.
	ErrInvalidData = errors.New("event data fails its schema")
)

// SchemaVersion is the version of every data schema in this catalogue.
const SchemaVersion = "v1"

//go:embed v1/*.json
var schemaFiles embed.FS

// entry ties an event type to its Go data type.
type entry struct {
	newData func() any
}

func catalogueEntries() map[string]entry {
	return map[string]entry{
		TypeSessionStarted:     {func() any { return new(SessionStarted) }},
		TypeSessionCompleted:   {func() any { return new(SessionCompleted) }},
		TypeSessionFailed:      {func() any { return new(SessionFailed) }},
		TypeJobRequested:       {func() any { return new(JobRequested) }},
		TypeJobStarted:         {func() any { return new(JobStarted) }},
		TypeJobHeartbeat:       {func() any { return new(JobHeartbeat) }},
		TypeJobReleased:        {func() any { return new(JobReleased) }},
		TypeJobCompleted:       {func() any { return new(JobCompleted) }},
		TypeJobFailed:          {func() any { return new(JobFailed) }},
		TypeToolStarted:        {func() any { return new(ToolStarted) }},
		TypeToolCompleted:      {func() any { return new(ToolCompleted) }},
		TypeAgentMessage:       {func() any { return new(AgentMessage) }},
		TypeArtifactStored:     {func() any { return new(ArtifactStored) }},
		TypeValidationPassed:   {func() any { return new(Verdict) }},
		TypeValidationFailed:   {func() any { return new(Verdict) }},
		TypeStepCompleted:      {func() any { return new(StepCompleted) }},
		TypeStepFailed:         {func() any { return new(StepFailed) }},
		TypeSignalStop:         {func() any { return new(Signal) }},
		TypeSignalPause:        {func() any { return new(Signal) }},
		TypeSignalResume:       {func() any { return new(Signal) }},
		TypeSignalInfo:         {func() any { return new(Signal) }},
		TypeSignalInvalidate:   {func() any { return new(Signal) }},
		TypeSignalAcknowledged: {func() any { return new(SignalAcknowledged) }},
		TypeJobCancelled:       {func() any { return new(JobCancelled) }},
		TypeStepWaiting:        {func() any { return new(StepWaiting) }},
		TypeStepPaused:         {func() any { return new(StepPaused) }},
		TypeStepResumed:        {func() any { return new(StepResumed) }},
		TypeStepInvalidated:    {func() any { return new(StepInvalidated) }},
		TypeSessionPaused:      {func() any { return new(SessionPaused) }},
		TypeSessionStopped:     {func() any { return new(SessionStopped) }},
		TypeSessionResumed:     {func() any { return new(SessionResumed) }},
		TypeTaskAdded:          {func() any { return new(TaskAdded) }},
		TypeTaskUpdated:        {func() any { return new(TaskUpdated) }},
		TypeTaskSelected:       {func() any { return new(TaskSelected) }},
		TypeBacklogPhase:       {func() any { return new(BacklogPhase) }},
		TypeHookCompleted:      {func() any { return new(HookRun) }},
		TypeHookFailed:         {func() any { return new(HookRun) }},
		TypeLoopSpawned:        {func() any { return new(LoopSpawned) }},
		TypeLoopMerged:         {func() any { return new(LoopMerged) }},
		TypeLoopRebase:         {func() any { return new(LoopRebase) }},
		TypeLoopInvalidated:    {func() any { return new(LoopInvalidated) }},

		// No session left hanging.
		TypeSessionBudget: {func() any { return new(SessionBudget) }},
		TypeSessionClosed: {func() any { return new(SessionClosed) }},
		TypeSessionRerun:  {func() any { return new(SessionRerun) }},
		TypeSessionForked: {func() any { return new(SessionForked) }},

		// Sessions imported from other systems.
		TypeStepImported: {func() any { return new(StepImported) }},

		// Approval gates.
		TypeSignalApprove:     {func() any { return new(Signal) }},
		TypeSignalReject:      {func() any { return new(Signal) }},
		TypeApprovalRequested: {func() any { return new(ApprovalRequested) }},
		TypeApprovalExpired:   {func() any { return new(ApprovalExpired) }},
	}
}

// DataSchemaURI returns the dataschema attribute for an event type: a URN
// naming the file schemas/v1/<entity>.<verb>.json in this repository.
func DataSchemaURI(typ string) string {
	ev, _ := EntityVerb(typ)
	return "urn:loopbus:schema:" + SchemaVersion + ":" + ev
}

// SchemaFile returns the embedded JSON Schema document of an event type.
func SchemaFile(typ string) ([]byte, error) {
	ev, err := EntityVerb(typ)
	if err != nil {
		return nil, err
	}
	b, err := schemaFiles.ReadFile(SchemaVersion + "/" + ev + ".json")
	if err != nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	return b, nil
}

// Catalogue validates and decodes event data. It is safe for concurrent
// use. Each type's schema is compiled when first needed, so a process pays
// only for the types it meets (a command-line call a few, a service its
// own); CompileAll compiles them all.
type Catalogue struct {
	entries  map[string]entry
	compiled map[string]*compiledSchema
}

// compiledSchema is one type's schema, compiled once, for the generic
// validator and for the fast check (nil when the schema uses a keyword
// the fast check lacks).
type compiledSchema struct {
	once sync.Once
	sch  *jsonschema.Schema
	fast *fastNode
	err  error
}

// NewCatalogue returns the catalogue of the embedded schemas.
func NewCatalogue() (*Catalogue, error) {
	c := &Catalogue{entries: catalogueEntries(), compiled: map[string]*compiledSchema{}}
	for typ := range c.entries {
		if _, err := SchemaFile(typ); err != nil {
			return nil, err
		}
		c.compiled[typ] = &compiledSchema{}
	}
	return c, nil
}

// CompileAll compiles every type's schema now, returning the first error.
func (c *Catalogue) CompileAll() error {
	for _, typ := range c.Types() {
		if _, err := c.schema(typ); err != nil {
			return err
		}
	}
	return nil
}

// schema returns typ's compiled schema, compiling it on first use.
func (c *Catalogue) schema(typ string) (*jsonschema.Schema, error) {
	cs := c.compiledOnce(typ)
	return cs.sch, cs.err
}

func (c *Catalogue) compiledOnce(typ string) *compiledSchema {
	cs := c.compiled[typ]
	cs.once.Do(func() {
		if cs.sch, cs.err = compileEventSchema(typ); cs.err == nil {
			cs.fast = compileFast(cs.sch)
		}
	})
	return cs
}

func compileEventSchema(typ string) (*jsonschema.Schema, error) {
	raw, err := SchemaFile(typ)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schema of %s: %w", typ, err)
	}
	comp := jsonschema.NewCompiler()
	comp.DefaultDraft(jsonschema.Draft2020)
	comp.UseLoader(noLoader{})
	uri := DataSchemaURI(typ)
	if err := comp.AddResource(uri, doc); err != nil {
		return nil, fmt.Errorf("schema of %s: %w", typ, err)
	}
	sch, err := comp.Compile(uri)
	if err != nil {
		return nil, fmt.Errorf("schema of %s: %w", typ, err)
	}
	return sch, nil
}

// Types lists the catalogue's event types, sorted.
func (c *Catalogue) Types() []string {
	out := make([]string, 0, len(c.entries))
	for t := range c.entries {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Known reports whether typ is in the catalogue.
func (c *Catalogue) Known(typ string) bool {
	_, ok := c.entries[typ]
	return ok
}

// Decode validates raw JSON data against the schema of typ and decodes it
// into the registered Go type. Errors wrap ErrUnknownType or ErrInvalidData.
func (c *Catalogue) Decode(typ string, raw []byte) (any, error) {
	e, ok := c.entries[typ]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	if err := c.validateRaw(typ, raw); err != nil {
		return nil, err
	}
	// JSON v2 matches member names exactly and refuses duplicate names, so
	// the Go value holds exactly the members the schema checked
	// (encoding/json would let {"JOBID": ""} overwrite a valid "jobId").
	v := e.newData()
	if err := jsonv2.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidData, typ, err)
	}
	return v, nil
}

// DecodeUnchecked decodes raw JSON data into the Go type registered for
// typ without checking it against the schema: for readers of events
// that were checked where they entered (see bus.ReadOptions.SkipSchema).
// Errors wrap ErrUnknownType or ErrInvalidData (not JSON, or a value of
// the wrong JSON type for its field).
func (c *Catalogue) DecodeUnchecked(typ string, raw []byte) (any, error) {
	e, ok := c.entries[typ]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	v := e.newData()
	if err := jsonv2.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidData, typ, err)
	}
	return v, nil
}

// Encode checks that data has the Go type registered for typ, validates it
// against the schema and returns its JSON.
func (c *Catalogue) Encode(typ string, data any) ([]byte, error) {
	e, ok := c.entries[typ]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	if want := e.newData(); reflect.TypeOf(want) != reflect.TypeOf(data) {
		return nil, fmt.Errorf("%w: %s wants data of type %T, got %T", ErrInvalidData, typ, want, data)
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidData, typ, err)
	}
	if err := c.validateRaw(typ, raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// validateRaw checks raw against typ's schema. The fast check decides
// the valid data it can; the generic validator decides the rest and says
// what is wrong.
func (c *Catalogue) validateRaw(typ string, raw []byte) error {
	if cs := c.compiledOnce(typ); cs.fast != nil && fastCheck(cs.fast, raw) == pass {
		return nil
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("%w: %s: data is not JSON: %v", ErrInvalidData, typ, err)
	}
	sch, err := c.schema(typ)
	if err != nil {
		return err
	}
	if err := sch.Validate(inst); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrInvalidData, typ, summarize(err))
	}
	return nil
}

// summarize flattens a jsonschema error into "pointer: message" items.
func summarize(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	var b bytes.Buffer
	for i, le := range leafErrors(ve) {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", DisplayPointer(le.Pointer), le.Message)
	}
	return b.String()
}
