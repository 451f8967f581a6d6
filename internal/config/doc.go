// Package config gives every tether command one way to take its settings: the
// command line, the environment and a YAML file, with one precedence.
//
// A command declares its flags on a pflag.FlagSet (cobra does this) and, once
// the command line is parsed, calls Apply. Apply fills every flag that was not
// given on the command line, first from the environment, then from the file:
//
//	flag  >  TETHER_<FLAG_IN_UPPER_SNAKE_CASE>  >  YAML file  >  flag default
//
// The file uses the long flag names as keys, one command per file:
//
//	# client.yaml
//	server: tunnel.example.com:7000
//	token-file: /var/run/secrets/tether/token
//	heartbeat-timeout: 90s            # durations are strings
//	tls-insecure-skip-verify: false   # booleans are YAML true/false
//	route:                            # list flags take a YAML list ...
//	  - /=http://app-proxy:80
//	  - /argo-cd=http://argocd-server:80
//	# ... or a single value, read as a one-element list: route: /=http://a:80
//
// and the same settings from the environment:
//
//	TETHER_SERVER=tunnel.example.com:7000
//	TETHER_HEARTBEAT_TIMEOUT=90s
//	TETHER_ROUTE=/=http://app-proxy:80,/argo-cd=http://argocd-server:80
//
// # Usage
//
// Call Apply after cobra has parsed the flags and before it checks required
// flags, that is from PreRunE or the root's PersistentPreRunE (cobra validates
// required flags and flag groups after both):
//
//	PreRunE: func(cmd *cobra.Command, _ []string) error {
//		fs := cmd.Flags()
//		return config.Apply(fs, config.Path(fs, "config", os.LookupEnv), os.LookupEnv,
//			"config", "help", "version")
//	},
//
// Path resolves the file from --config, else TETHER_CONFIG, else the
// flag's default. Name in skip every flag that must not come from the
// environment or the file: the one that names the file itself, and --help and
// --version.
//
// # Rules
//
//   - A value from the environment or the file is applied through
//     FlagSet.Set, so the flag counts as changed: fs.Changed, fs.Visit and
//     cobra's MarkFlagRequired and flag-group checks see it exactly as if it had
//     been typed, and a deprecated flag prints its deprecation notice.
//   - Every value goes through the flag's own parser (its pflag.Value), so a
//     file or variable accepts exactly what the command line accepts.
//   - List flags are those whose value implements pflag.SliceValue
//     (stringSlice, stringArray, intSlice, ...). A list from the file or the
//     environment replaces the default instead of appending to it. From the
//     environment, a list is split on every comma and each item trimmed of
//     spaces: an item that itself contains a comma must go in the file or on
//     the command line.
//   - An environment variable that is set but empty counts as unset (Helm and
//     Kubernetes manifests render missing values as ""), and so does a YAML
//     key with no value (key: or key: null): the next source applies.
//   - The file is decoded strictly: an unknown key, a duplicate key, a key
//     named in skip, a list or map where one value is wanted, a second YAML
//     document, or a top level that is not a map is an error. Errors name the
//     file, the line and the key, suggest the closest known key for a typo,
//     and say what to write instead.
//   - All problems from the environment and the file are collected with
//     errors.Join, so a user fixes them in one pass.
//   - The value of a flag whose name ends in -token, -secret or -password is
//     never quoted in an error.
//
// # What it does not do
//
// There are no nested keys, sections per command, includes, ${VAR}
// expansion inside the file, YAML merge keys (<<), or reloading: the file is
// read once at start-up. Validation across flags (for example "--tls-cert needs
// --tls-key") belongs to the command's options, which run after Apply. Secrets
// are never flag values in tether; flags name the files that hold them.
package config
