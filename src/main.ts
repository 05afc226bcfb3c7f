import { main } from "./cli/main.js";

main();
